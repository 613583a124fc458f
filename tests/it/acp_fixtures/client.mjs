// Drives `kestrel acp` with the official ACP client (npm `@agentclientprotocol/sdk`, its
// stable v1 entry point), unchanged, through one scenario, and prints what it saw as JSON.
// Usage: node client.mjs <sdk dist/v1/stable/acp.js> <phase: hello | first | reload> <cwd> <kestrel> <args...>
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";

const [sdkPath, phase, cwd, kestrel, ...args] = process.argv.slice(2);
const acp = await import(sdkPath);

const child = spawn(kestrel, ["acp", ...args], { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

const updates = [];
const permissions = [];
// How each permission request is answered, in order: an option's id, or "cancel".
const decisions = ["allow", "reject", "cancel"];
let connection = null;

const app = acp
  .client({ name: "kestrel-acp-test" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params);
  })
  .onRequest(acp.methods.client.session.requestPermission, async ({ params }) => {
    const decision = decisions[permissions.length] ?? "reject";
    permissions.push({ toolCall: params.toolCall, options: params.options.map((o) => o.kind), decision });
    if (decision === "cancel") {
      await connection.notify(acp.methods.agent.session.cancel, { sessionId: params.sessionId });
      return { outcome: { outcome: "cancelled" } };
    }
    return { outcome: { outcome: "selected", optionId: decision } };
  });

const report = { phase };
const since = () => updates.length;
const turn = async (sessionId, text) => {
  const from = since();
  const answer = await connection.request(acp.methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text }],
  });
  return { stopReason: answer.stopReason, updates: updates.slice(from).map((u) => u.update) };
};

await app.connectWith(stream, async (ctx) => {
  connection = ctx;
  report.initialize = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  if (phase === "hello") {
    const { sessionId } = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    report.sessionId = sessionId;
    report.hello = await turn(sessionId, "hello there");
  } else if (phase === "first") {
    const { sessionId } = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    report.sessionId = sessionId;
    report.hello = await turn(sessionId, "hello there");
    const write = (path, content) => `/tool write_file ${JSON.stringify({ path, content })}`;
    report.approved = await turn(sessionId, write("approved.txt", "one\n"));
    report.rejected = await turn(sessionId, write("rejected.txt", "two\n"));
    report.cancelled = await turn(sessionId, write("cancelled.txt", "three\n"));
    report.permissions = permissions;
  } else {
    const listed = await ctx.request(acp.methods.agent.session.list, { cwd });
    report.listed = listed.sessions;
    const sessionId = listed.sessions[0].sessionId;
    const from = since();
    report.load = await ctx.request(acp.methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
    report.replayed = updates.slice(from).map((u) => u.update);
    report.after = await turn(sessionId, "still there?");
  }
});
child.stdin.end();
await new Promise((resolve) => child.on("exit", resolve));
process.stdout.write(JSON.stringify(report) + "\n");
