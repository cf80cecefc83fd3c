// The senders' JavaScript libraries sign for us and verify our signatures.
// Input (stdin, JSON): {secrets, body, timestamp, ours: {standard, stripe, github}}.
// Output (stdout, JSON): what each library signed, and whether it accepted ours.
import { sign as octokitSign, verify as octokitVerify } from "@octokit/webhooks-methods";
import { Webhook as StandardWebhook } from "standardwebhooks";
import Stripe from "stripe";
import { Webhook as SvixWebhook } from "svix";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const { secrets, body, timestamp, ours } = input;
const moment = new Date(timestamp * 1000);
const stripe = new Stripe("sk_test_unused");

function accepts(check) {
  try {
    check();
    return true;
  } catch {
    return false;
  }
}

const svixHeaders = Object.fromEntries(
  Object.entries(ours.standard).map(([name, value]) => [name.replace("webhook-", "svix-"), value]),
);
const stripeHeader = stripe.webhooks.generateTestHeaderString({
  payload: body, secret: secrets.stripe, timestamp,
});
const output = {
  signed: {
    svix: new SvixWebhook(secrets.standard).sign("msg_js_svix", moment, body),
    standardwebhooks: new StandardWebhook(secrets.standard).sign("msg_js_std", moment, body),
    stripe: stripeHeader,
    octokit: await octokitSign(secrets.github, body),
  },
  accepted: {
    svix_svix_headers: accepts(() => new SvixWebhook(secrets.standard).verify(body, svixHeaders)),
    svix_webhook_headers: accepts(() => new SvixWebhook(secrets.standard).verify(body, ours.standard)),
    // Both header sets at once, naming one message: svix accepts it, and so must we.
    svix_both_sets: accepts(() => new SvixWebhook(secrets.standard).verify(
      body, { ...ours.standard, ...svixHeaders })),
    standardwebhooks: accepts(() => new StandardWebhook(secrets.standard).verify(body, ours.standard)),
    stripe: accepts(() => stripe.webhooks.constructEvent(body, ours.stripe, secrets.stripe)),
    stripe_potato: accepts(() => stripe.webhooks.constructEvent(
      body, `${stripeHeader},v1=potato`, secrets.stripe)),
    octokit: await octokitVerify(secrets.github, body, ours.github),
  },
};
process.stdout.write(JSON.stringify(output));
