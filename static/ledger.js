// Replay Ledger dashboard: small, dependency-free behaviours on top of server-rendered pages.
// - Times: the server renders UTC in <time datetime="…"> (filters take UTC too); the
//   browser's local time is in each time's tooltip, re-applied after every htmx swap.
// - "/" focuses the header search box when there is one, else the page's first filter input.
// - Export links and self-refreshing lists use the filter the page shows now (htmx pushes it
//   into the URL).
// - A button with data-dismiss="<selector>" removes its closest match (a "Cancel").
// - Polling (hx-trigger="every …" on a [data-poll] element) pauses while the tab is hidden,
//   while focus is inside data-poll-idle, or while data-poll-hold matches something. These
//   were htmx trigger filters, which htmx evaluates as strings: the CSP forbids that.
//   A 401 (the session ended) stops polling for good.
(function () {
  "use strict";

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function localText(date) {
    var offset = -date.getTimezoneOffset();
    var sign = offset >= 0 ? "+" : "-";
    offset = Math.abs(offset);
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      " " + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds()) +
      " " + sign + pad(Math.floor(offset / 60)) + ":" + pad(offset % 60);
  }

  function applyZone(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var date = new Date(el.getAttribute("datetime"));
      if (!isNaN(date.getTime())) { el.title = "your local time: " + localText(date); }
    });
  }

  function focusSearch(event) {
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) { return; }
    var target = event.target;
    if (target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName))) {
      return;
    }
    var box = document.querySelector("header input[type=search], header input[name=q]") ||
      document.querySelector("main form.filters input:not([type=hidden]), main form.filters select");
    if (box) { event.preventDefault(); box.focus(); }
  }

  function freshExportLink(event) {
    var link = event.target.closest && event.target.closest("a[data-export]");
    if (!link) { return; }
    var params = new URLSearchParams(window.location.search);
    params.delete("cursor");
    link.href = link.href.split("?")[0] + "?" + params.toString();
  }

  function pausePoll(event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-poll")) { return; }
    var idle = elt.getAttribute("data-poll-idle");
    var hold = elt.getAttribute("data-poll-hold");
    var focused = document.activeElement;
    if (document.visibilityState !== "visible" ||
        (idle && focused && focused.closest && focused.closest(idle)) ||
        (hold && document.querySelector(hold))) {
      event.preventDefault();
    }
  }

  document.addEventListener("DOMContentLoaded", function () { applyZone(document); });
  // After a bulk action, focus goes to its confirmation or result (marked data-focus, once)
  // so that keyboard and screen-reader users land on it; its aria-live region announces it.
  function focusResult() {
    var box = document.querySelector("[data-focus]:not([data-focused])");
    if (box) { box.setAttribute("data-focused", ""); box.focus(); }
  }

  document.addEventListener("htmx:afterSettle", function (event) {
    applyZone(event.target);
    focusResult();
  });
  document.addEventListener("keydown", focusSearch);
  // A self-refreshing list asks for the URL the page shows now (filters push it), not the
  // one it was rendered with.
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt && event.detail.elt.hasAttribute("data-refresh")) {
      event.detail.path = window.location.pathname + window.location.search;
    }
  });
  document.addEventListener("click", freshExportLink);
  // A Cancel button removes the box it names (no inline script: the page's CSP forbids it).
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-dismiss]");
    if (button) { var box = button.closest(button.getAttribute("data-dismiss")); if (box) { box.remove(); } }
  });
  // A 401 means the session ended: the server sends HX-Redirect to the login page; should a
  // 401 come without it, keep the page as it is and stop asking rather than blank it.
  var sessionEnded = false;
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.xhr.status === 401) { event.detail.shouldSwap = false; sessionEnded = true; }
  });
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (sessionEnded) { event.preventDefault(); return; }
    pausePoll(event);
  });
})();
