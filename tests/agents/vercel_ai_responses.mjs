// The Vercel AI SDK's OpenAI Responses provider (`openai.responses(...)`) with its defaults
// (`store` left at true: step 2 refers to step 1's items by `item_reference`) against
// Sluice, for tests/e2e/conversation.rs: a multi-step tool loop with generateText, then
// one with streamText. The one tool, `shell_command`, only echoes (`echo X` prints X).
// Usage: node vercel_ai_responses.mjs BASE_URL KEY MODEL PROMPT
// Prints `generate <JSON text> <steps>` and `stream <JSON text> <steps>`, exits 0; any error
// is printed and exits 1.
import { generateText, streamText, tool, jsonSchema, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const [base, key, model, prompt] = process.argv.slice(2);
if (!prompt) {
  console.error('usage: node vercel_ai_responses.mjs BASE_URL KEY MODEL PROMPT');
  process.exit(2);
}
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
const tools = {
  shell_command: tool({
    description: 'Run a shell command and return what it printed.',
    inputSchema: jsonSchema({
      type: 'object',
      properties: { command: { type: 'string' } },
      required: ['command'],
      additionalProperties: false,
    }),
    execute: async ({ command }) =>
      command.startsWith('echo ') ? command.slice(5) : `refused: ${command}`,
  }),
};
try {
  const r = await generateText({
    model: openai.responses(model),
    prompt,
    tools,
    stopWhen: stepCountIs(4),
    maxRetries: 0,
  });
  console.log(`generate ${JSON.stringify(r.text)} ${r.steps.length}`);
  let errored = null;
  const s = streamText({
    model: openai.responses(model),
    prompt,
    tools,
    stopWhen: stepCountIs(4),
    maxRetries: 0,
    onError: ({ error }) => {
      errored = error;
    },
  });
  let text = '';
  for await (const part of s.textStream) text += part;
  if (errored) throw errored;
  console.log(`stream ${JSON.stringify(text)} ${(await s.steps).length}`);
} catch (e) {
  console.error(`vercel ai sdk failed: ${e?.stack ?? e}`);
  if (e?.responseBody) console.error(`response body: ${e.responseBody}`);
  process.exit(1);
}
