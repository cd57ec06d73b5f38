// A stateful streamable-HTTP server built on the TypeScript SDK with one slow
// echo tool: the same server as the Python one, for the npm package's test.
// In one session, concurrent `tools/call` POSTs sharing a JSON-RPC id
// cross-wire in this SDK too (its transport maps responses by id alone).
// Listens on loopback, on $PORT when set (as `mcp-id-guard --upstream-port N
// -- node echo-server.mjs` sets it), else on a free port, and announces it as
// its first line on stdout, `LISTENING <port>`.
import { randomUUID } from "node:crypto";
import http from "node:http";

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const MAX_BODY_BYTES = 1024 * 1024;
const transports = new Map();

function echoServer() {
  const server = new McpServer({ name: "echo", version: "0.0.0" });
  server.registerTool(
    "echo",
    { description: "Answers with the sentinel after a random delay", inputSchema: { sentinel: z.string() } },
    async ({ sentinel }) => {
      await new Promise((resolve) => setTimeout(resolve, Math.random() * 500));
      return { content: [{ type: "text", text: `ECHO:${sentinel}` }] };
    },
  );
  return server;
}

function refuse(res, status, message) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32600, message } }));
}

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new Error("body too large");
    chunks.push(chunk);
  }
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const httpServer = http.createServer(async (req, res) => {
  try {
    if (new URL(req.url, "http://127.0.0.1").pathname !== "/mcp") return refuse(res, 404, "not found");
    const body = req.method === "POST" ? await readJson(req) : undefined;
    const sessionId = req.headers["mcp-session-id"];
    let transport = sessionId === undefined ? undefined : transports.get(sessionId);
    if (transport === undefined) {
      if (sessionId !== undefined) return refuse(res, 404, "unknown session");
      if (req.method !== "POST" || !isInitializeRequest(body)) return refuse(res, 400, "initialize first");
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
      await echoServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (error) {
    if (!res.headersSent) refuse(res, 400, String(error));
    else res.end();
  }
});

httpServer.listen(Number(process.env.PORT || 0), "127.0.0.1", () => {
  console.log(`LISTENING ${httpServer.address().port}`);
});
process.on("SIGTERM", () => process.exit(0));
