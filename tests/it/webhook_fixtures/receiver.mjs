// A webhook receiver for the tests: every delivery is verified with the official Standard
// Webhooks library (npm `standardwebhooks`), and reported on stdout as one JSON line. Its
// secret and how many deliveries it fails first (with 503) are set by `POST /__control`.
// Usage: node receiver.mjs <path to standardwebhooks' dist/index.js>
import http from "node:http";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { Webhook } = require(process.argv[2]);
let secret = null;
let failing = 0;
// Requests left unanswered (the sender's timeout must end them), and whether a verified
// delivery is answered with a 16 MiB body (the sender must not read it all).
let hanging = 0;
let huge = false;

const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

const server = http.createServer((request, response) => {
  const chunks = [];
  request.on("data", (chunk) => chunks.push(chunk));
  request.on("end", () => {
    const body = Buffer.concat(chunks).toString("utf8");
    if (request.url === "/__control") {
      const control = JSON.parse(body);
      if ("secret" in control) secret = control.secret;
      if ("fail" in control) failing = control.fail;
      if ("hang" in control) hanging = control.hang;
      if ("huge" in control) huge = control.huge;
      response.writeHead(204).end();
      say({ control });
      return;
    }
    const id = request.headers["webhook-id"];
    if (hanging > 0) {
      hanging -= 1;
      say({ hung: true, id });
      return;
    }
    if (failing > 0) {
      failing -= 1;
      say({ status: 503, id });
      response.writeHead(503).end("not now");
      return;
    }
    try {
      const payload = new Webhook(secret).verify(body, request.headers);
      say({ verified: true, id, timestamp: request.headers["webhook-timestamp"], path: request.url, payload });
      if (huge) response.writeHead(200).end(Buffer.alloc(16 * 1024 * 1024, 120));
      else response.writeHead(204).end();
    } catch (error) {
      say({ verified: false, id, error: String(error) });
      response.writeHead(400).end("bad signature");
    }
  });
});

server.listen(0, "127.0.0.1", () => say({ listening: server.address().port }));
