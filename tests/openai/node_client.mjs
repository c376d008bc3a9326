// Streams a chat completion through the official OpenAI Node.js client (npm `openai`).
// Usage: node node_client.mjs OPENAI_MODULE_DIR BASE_URL BODY_JSON
// Prints one JSON line: the streamed text, the chunk count, the finish_reason and the usage.
import { createRequire } from 'node:module';

const [moduleDir, baseURL, bodyJson] = process.argv.slice(2);
const require = createRequire(moduleDir + '/');
const OpenAI = require('openai');
const client = new OpenAI({ baseURL, apiKey: 'no-token-needed', maxRetries: 0, timeout: 60000 });
const body = JSON.parse(bodyJson);
// `documents` is this server's extension: the client sends unknown fields as they are.
const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
let text = '';
let chunks = 0;
let finishReason = null;
let usage = null;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    text += choice.delta?.content ?? '';
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }
}
const models = await client.models.list();
console.log(JSON.stringify({ text, chunks, finish_reason: finishReason, usage, models: models.data.map((m) => m.id) }));
