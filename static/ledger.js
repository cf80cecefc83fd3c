// Replay Ledger dashboard: small, dependency-free behaviours on top of server-rendered pages.
// - Times: the server renders UTC in <time datetime="…">; a header toggle shows them in the
//   browser's zone instead (remembered in localStorage), re-applied after every htmx swap.
// - "/" focuses the header search box when there is one, else the page's first filter input.
// - Export links and self-refreshing lists use the filter the page shows now (htmx pushes it
//   into the URL).
// - A button with data-dismiss="<selector>" removes its closest match (a "Cancel").
// - Polling (hx-trigger="every …" on a [data-poll] element) pauses while the tab is hidden,
//   while focus is inside data-poll-idle, or while data-poll-hold matches something. These
//   were htmx trigger filters, which htmx evaluates as strings: the CSP forbids that.
(function () {
  "use strict";
  var KEY = "ledger.tz";

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
    var local = localStorage.getItem(KEY) === "local";
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      if (!el.dataset.utc) { el.dataset.utc = el.textContent; }
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) { return; }
      el.textContent = local ? localText(date) : el.dataset.utc;
      el.title = local ? el.dataset.utc : localText(date);
    });
    var button = document.getElementById("tz-toggle");
    if (button) {
      button.textContent = local ? "Times: local" : "Times: UTC";
      button.setAttribute("aria-pressed", local ? "true" : "false");
    }
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

  // "Cancel" removes the question it belongs to (no inline handlers: the CSP forbids them).
  function dismiss(event) {
    var button = event.target.closest && event.target.closest("button[data-dismiss]");
    var box = button && button.closest(button.getAttribute("data-dismiss"));
    if (box) { box.remove(); }
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

  document.addEventListener("DOMContentLoaded", function () {
    applyZone(document);
    var button = document.getElementById("tz-toggle");
    if (button) {
      button.addEventListener("click", function () {
        localStorage.setItem(KEY, localStorage.getItem(KEY) === "local" ? "utc" : "local");
        applyZone(document);
      });
    }
  });
  document.addEventListener("htmx:afterSettle", function (event) { applyZone(event.target); });
  document.addEventListener("keydown", focusSearch);
  // A self-refreshing list asks for the URL the page shows now (filters push it), not the
  // one it was rendered with.
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt && event.detail.elt.hasAttribute("data-refresh")) {
      event.detail.path = window.location.pathname + window.location.search;
    }
  });
  document.addEventListener("click", freshExportLink);
  document.addEventListener("click", dismiss);
  document.addEventListener("htmx:beforeRequest", pausePoll);
})();
