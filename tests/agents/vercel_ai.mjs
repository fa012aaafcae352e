// The Vercel AI SDK (`ai` with its OpenAI Chat and Anthropic providers) against Sluice, for
// tests/e2e/agents.rs: for each provider, one generateText and one streamText call.
// Usage: node vercel_ai.mjs BASE_URL KEY OPENAI_MODEL ANTHROPIC_MODEL
// Prints one line per call, `<provider> <mode> <JSON of the text>`, and exits 0; any error
// is printed and exits 1.
import { generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';

const [base, key, openaiModel, anthropicModel] = process.argv.slice(2);
if (!anthropicModel) {
  console.error('usage: node vercel_ai.mjs BASE_URL KEY OPENAI_MODEL ANTHROPIC_MODEL');
  process.exit(2);
}
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: key });
const models = [
  ['openai-chat', openai.chat(openaiModel)],
  ['anthropic', anthropic(anthropicModel)],
];
const prompt = 'Say hello.';
try {
  for (const [name, model] of models) {
    const r = await generateText({ model, prompt, maxRetries: 0 });
    console.log(`${name} generate ${JSON.stringify(r.text)} ${r.finishReason}`);
    let errored = null;
    const s = streamText({ model, prompt, maxRetries: 0, onError: ({ error }) => { errored = error; } });
    let text = '';
    for await (const part of s.textStream) text += part;
    if (errored) throw errored;
    console.log(`${name} stream ${JSON.stringify(text)} ${await s.finishReason}`);
  }
} catch (e) {
  console.error(`vercel ai sdk failed: ${e?.stack ?? e}`);
  if (e?.responseBody) console.error(`response body: ${e.responseBody}`);
  process.exit(1);
}
