// A service that receives a Replay Ledger destination (docs/how-to/destinations.md).
//
// Every request is verified with the destination's signing secret (Standard Webhooks),
// and each event takes effect once: the ledger delivers at least once, with the same
// Idempotency-Key on every attempt, so a repeat answers the first outcome again.
//
//   LEDGER_DESTINATION_SECRET=whsec_… PORT=3000 node server.mjs
import http from "node:http";
import { Webhook } from "standardwebhooks";

const secret = process.env.LEDGER_DESTINATION_SECRET;
if (!secret) {
  console.error("set LEDGER_DESTINATION_SECRET to the destination's whsec_… secret");
  process.exit(2);
}
const webhook = new Webhook(secret);

// Keep this in your database, with a unique index on the key, in the same transaction
// as the effect itself: an in-memory map forgets everything on restart.
const outcomes = new Map();
let ordersPaid = 0;

function applyOnce(key, event) {
  if (!outcomes.has(key)) {
    ordersPaid += 1; // the business effect: here, counting paid orders
    outcomes.set(key, `order:${ordersPaid}`);
    console.log(JSON.stringify({ applied: key, type: event.type, total: ordersPaid }));
  }
  return outcomes.get(key);
}

const server = http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const body = Buffer.concat(chunks);
    let event;
    try {
      event = webhook.verify(body, request.headers); // the raw bytes, never re-serialised
    } catch {
      response.writeHead(401).end("signature does not verify\n");
      return;
    }
    const resultRef = applyOnce(request.headers["idempotency-key"], event);
    // X-Result-Ref becomes the receipt's result_ref in the ledger.
    response.writeHead(200, { "X-Result-Ref": resultRef }).end("ok\n");
  });
});

server.listen(Number(process.env.PORT ?? 3000), process.env.HOST ?? "127.0.0.1", () => {
  console.log(JSON.stringify({ listening: server.address().port }));
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
