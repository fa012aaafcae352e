"""End-to-end check of Sluice's Anthropic Messages and OpenAI Responses endpoints with the
official `anthropic` and `openai` Python packages.

Run by `tests/e2e/sdk_dialects.rs` against a real Sluice in front of the mock upstream:

    python tests/sdk/dialects_client.py --base-url http://127.0.0.1:PORT \
        --key VIRTUAL_KEY --model acme/claude --model acme/gpt \
        --mock-url http://127.0.0.1:MOCK --text-behavior '{...}' --expect-text "..." \
        --tools-behavior '{...}' --expect-tool-text "..." \
        --expect-tools '[{"name": ..., "arguments": {...}}]' \
        --reasoning-behavior '{...}' --expect-reasoning "..."

For each model it runs the plain-text checks with the mock answering `--text-behavior`,
the tool checks (`anthropic` `messages.stream` with tools, `openai` `responses.create`
and `responses.stream` with a function tool, Chat Completions streaming with tools) with the
mock answering `--tools-behavior`, then the reasoning checks (thinking blocks, reasoning
items) with `--reasoning-behavior` (each set through the mock's `POST /_mock/behavior`; one Python
process for everything, as importing the SDKs is slow). Exits 0 and prints `sdk ok` when
every check passed; any failure raises (non-zero exit).
"""

import argparse
import json
import urllib.request

import anthropic
import openai


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def messages(args):
    # The anthropic SDK appends /v1/messages to the base URL and sends `x-api-key`.
    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=args.key, max_retries=0, timeout=20.0
    )
    msgs = [{"role": "user", "content": "Say hello"}]

    msg = client.messages.create(
        model=args.model, max_tokens=256, system="be brief", messages=msgs
    )
    check(msg.type == "message", f"type {msg.type!r}")
    check(msg.model == args.model, f"model {msg.model!r} != {args.model!r}")
    text = "".join(b.text for b in msg.content if b.type == "text")
    check(text == args.expect_text, f"text {text!r} != {args.expect_text!r}")
    check(msg.stop_reason == "end_turn", f"stop_reason {msg.stop_reason!r}")
    check(msg.usage.output_tokens > 0, f"usage {msg.usage!r}")
    print(f"messages.create: {text!r}, usage {msg.usage.output_tokens}")

    with client.messages.stream(
        model=args.model, max_tokens=256, messages=msgs
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == args.expect_text, f"streamed {streamed!r} != {args.expect_text!r}")
    check(final.model == args.model, f"stream model {final.model!r}")
    check(final.stop_reason == "end_turn", f"stream stop_reason {final.stop_reason!r}")
    check(final.usage.output_tokens > 0, f"stream usage {final.usage!r}")
    print(f"messages.stream: {streamed!r}, usage {final.usage.output_tokens}")

    bad = anthropic.Anthropic(
        base_url=args.base_url, api_key="sk-sluice-not-a-key", max_retries=0, timeout=20.0
    )
    try:
        bad.messages.create(model=args.model, max_tokens=16, messages=msgs)
        raise AssertionError("an unknown key was accepted")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")
        check(e.body["error"]["type"] == "authentication_error", f"body {e.body!r}")
    try:
        client.messages.create(model="acme/none", max_tokens=16, messages=msgs)
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", f"body {e.body!r}")
    print("messages errors: ok")


def responses(args):
    client = openai.OpenAI(
        base_url=args.base_url + "/v1", api_key=args.key, max_retries=0, timeout=20.0
    )
    resp = client.responses.create(
        model=args.model, instructions="be brief", input="Say hello"
    )
    check(resp.model == args.model, f"model {resp.model!r} != {args.model!r}")
    check(resp.status == "completed", f"status {resp.status!r}")
    check(resp.output_text == args.expect_text, f"text {resp.output_text!r}")
    check(resp.usage is not None and resp.usage.output_tokens > 0, f"usage {resp.usage!r}")
    print(f"responses.create: {resp.output_text!r}")

    with client.responses.stream(model=args.model, input="Say hello") as stream:
        deltas = []
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    streamed = "".join(deltas)
    check(streamed == args.expect_text, f"streamed {streamed!r} != {args.expect_text!r}")
    check(final.model == args.model, f"stream model {final.model!r}")
    check(final.status == "completed", f"stream status {final.status!r}")
    check(final.output_text == args.expect_text, f"final text {final.output_text!r}")
    check(final.usage is not None and final.usage.output_tokens > 0, f"usage {final.usage!r}")
    print(f"responses.stream: {streamed!r}")

    try:
        client.responses.create(
            model=args.model, input="hi", previous_response_id="resp_123"
        )
        raise AssertionError("previous_response_id was accepted")
    except openai.BadRequestError as e:
        check(e.param == "previous_response_id", f"param {e.param!r}")
    print("responses errors: ok")


WEATHER_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["city"],
}
TOOL_PROMPT = "Weather in Zürich, and the time?"


def check_tool_calls(got, want, what):
    """`got`: [(id, name, arguments as JSON text or dict)] against `want` [{name, arguments}]."""
    check(len(got) == len(want), f"{what}: {len(got)} tool calls, want {len(want)}: {got!r}")
    ids = set()
    for (call_id, name, arguments), w in zip(got, want):
        check(call_id, f"{what}: empty call id")
        ids.add(call_id)
        check(name == w["name"], f"{what}: name {name!r} != {w['name']!r}")
        if isinstance(arguments, str):
            arguments = json.loads(arguments)  # valid JSON or this raises
        check(arguments == w["arguments"], f"{what}: arguments {arguments!r} != {w['arguments']!r}")
    check(len(ids) == len(want), f"{what}: call ids not distinct: {got!r}")


def messages_tools(args):
    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=args.key, max_retries=0, timeout=20.0
    )
    tools = [
        {"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER_TOOL_SCHEMA},
        {"name": "get_time", "description": "Time in a zone",
         "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    ]
    fragments = []
    with client.messages.stream(
        model=args.model,
        max_tokens=512,
        tools=tools,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
    ) as stream:
        text = ""
        for event in stream:
            if event.type == "text":
                text += event.text
            elif event.type == "input_json":
                fragments.append(event.partial_json)
        final = stream.get_final_message()
    check(text == args.expect_tool_text, f"tool stream text {text!r}")
    if args.model in args.whole_tool_calls:
        # A provider that sends each call whole (Gemini): one fragment per call.
        check(len(fragments) == len(args.expect_tools), f"input_json events {fragments!r}")
    else:
        check(len(fragments) > 2, f"input_json events {fragments!r}")
    check(final.model == args.model, f"tool stream model {final.model!r}")
    check(final.stop_reason == "tool_use", f"tool stream stop_reason {final.stop_reason!r}")
    check(final.usage.output_tokens > 0, f"tool stream usage {final.usage!r}")
    calls = [(b.id, b.name, b.input) for b in final.content if b.type == "tool_use"]
    check_tool_calls(calls, args.expect_tools, "messages.stream")
    print(f"messages.stream with tools: {calls!r}")


def responses_tools(args):
    client = openai.OpenAI(
        base_url=args.base_url + "/v1", api_key=args.key, max_retries=0, timeout=20.0
    )
    tools = [
        {"type": "function", "name": "get_weather", "description": "Weather of a city",
         "parameters": WEATHER_TOOL_SCHEMA},
        {"type": "function", "name": "get_time", "description": "Time in a zone",
         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    ]
    resp = client.responses.create(model=args.model, input=TOOL_PROMPT, tools=tools)
    check(resp.model == args.model, f"model {resp.model!r}")
    check(resp.status == "completed", f"status {resp.status!r}")
    check(resp.output_text == args.expect_tool_text, f"text {resp.output_text!r}")
    calls = [(i.call_id, i.name, i.arguments) for i in resp.output if i.type == "function_call"]
    check_tool_calls(calls, args.expect_tools, "responses.create")
    check(resp.usage is not None and resp.usage.output_tokens > 0, f"usage {resp.usage!r}")
    print(f"responses.create with tools: {calls!r}")

    with client.responses.stream(model=args.model, input=TOOL_PROMPT, tools=tools) as stream:
        args_done = []
        for event in stream:
            if event.type == "response.function_call_arguments.done":
                args_done.append(event.arguments)
        final = stream.get_final_response()
    check(final.model == args.model, f"stream model {final.model!r}")
    check(final.status == "completed", f"stream status {final.status!r}")
    check(final.output_text == args.expect_tool_text, f"stream text {final.output_text!r}")
    calls = [(i.call_id, i.name, i.arguments) for i in final.output if i.type == "function_call"]
    check_tool_calls(calls, args.expect_tools, "responses.stream")
    check(args_done == [c[2] for c in calls], f"arguments.done {args_done!r} != {calls!r}")
    print(f"responses.stream with tools: {calls!r}")


def chat_tools(args):
    client = openai.OpenAI(
        base_url=args.base_url + "/v1", api_key=args.key, max_retries=0, timeout=20.0
    )
    tools = [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                          "parameters": WEATHER_TOOL_SCHEMA}},
        {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                          "parameters": {"type": "object",
                                                         "properties": {"tz": {"type": "string"}}}}},
    ]
    with client.chat.completions.stream(
        model=args.model,
        messages=[{"role": "user", "content": TOOL_PROMPT}],
        tools=tools,
        stream_options={"include_usage": True},
    ) as stream:
        done_args = []
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done_args.append(event.arguments)
        final = stream.get_final_completion()
    check(final.model == args.model, f"chat model {final.model!r}")
    choice = final.choices[0]
    check(choice.finish_reason == "tool_calls", f"chat finish_reason {choice.finish_reason!r}")
    check(choice.message.content == args.expect_tool_text, f"chat text {choice.message.content!r}")
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    check_tool_calls(calls, args.expect_tools, "chat.completions.stream")
    check(done_args == [c[2] for c in calls], f"arguments.done {done_args!r}")
    check(final.usage is not None and final.usage.completion_tokens > 0, f"chat usage {final.usage!r}")
    print(f"chat.completions.stream with tools: {calls!r}")


def reasoning(args):
    """Reasoning reaches each SDK as its own kind of output, never inside the text."""
    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=args.key, max_retries=0, timeout=20.0
    )
    msgs = [{"role": "user", "content": "Think, then say hello"}]
    with client.messages.stream(
        model=args.model, max_tokens=2048, messages=msgs,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        thinking = "".join(e.thinking for e in stream if e.type == "thinking")
        final = stream.get_final_message()
    check(thinking == args.expect_reasoning, f"thinking {thinking!r}")
    blocks = [b.type for b in final.content]
    check(blocks == ["thinking", "text"], f"blocks {blocks!r}")
    check(final.content[0].thinking == args.expect_reasoning, f"final thinking {final.content[0]!r}")
    check(final.content[1].text == args.expect_text, f"final text {final.content[1]!r}")
    check(final.stop_reason == "end_turn", f"stop_reason {final.stop_reason!r}")
    print(f"messages.stream with thinking: {thinking!r}")

    client = openai.OpenAI(
        base_url=args.base_url + "/v1", api_key=args.key, max_retries=0, timeout=20.0
    )
    resp = client.responses.create(model=args.model, input="Think", reasoning={"effort": "low"})
    check(resp.output_text == args.expect_text, f"reasoning text {resp.output_text!r}")
    items = [i for i in resp.output if i.type == "reasoning"]
    check(len(items) == 1, f"reasoning items {resp.output!r}")
    summary = "".join(p.text for p in items[0].summary)
    check(summary == args.expect_reasoning, f"summary {summary!r}")
    with client.responses.stream(
        model=args.model, input="Think", reasoning={"effort": "low"}
    ) as stream:
        deltas = "".join(
            e.delta for e in stream if e.type == "response.reasoning_summary_text.delta"
        )
        final = stream.get_final_response()
    check(deltas == args.expect_reasoning, f"reasoning deltas {deltas!r}")
    check(final.output_text == args.expect_text, f"stream text {final.output_text!r}")
    items = [i for i in final.output if i.type == "reasoning"]
    check(len(items) == 1 and "".join(p.text for p in items[0].summary) == args.expect_reasoning,
          f"stream reasoning items {final.output!r}")
    print(f"responses with reasoning: {summary!r}")


def set_mock_behavior(mock_url, behavior):
    req = urllib.request.Request(
        mock_url + "/_mock/behavior", data=behavior.encode(), method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        check(r.status == 200, f"set mock behavior: {r.status}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True, action="append")
    ap.add_argument("--mock-url", required=True)
    ap.add_argument("--text-behavior", required=True)
    ap.add_argument("--expect-text", required=True)
    ap.add_argument("--tools-behavior", required=True)
    ap.add_argument("--expect-tool-text", required=True)
    ap.add_argument("--expect-tools", required=True, type=json.loads)
    ap.add_argument("--reasoning-behavior", required=True)
    ap.add_argument("--expect-reasoning", required=True)
    ap.add_argument("--whole-tool-calls", action="append", default=[],
                    help="a model whose provider sends each tool call whole (Gemini)")
    opts = ap.parse_args()
    for model in opts.model:
        args = argparse.Namespace(**{**vars(opts), "model": model})
        print(f"--- {model}")
        set_mock_behavior(opts.mock_url, opts.text_behavior)
        messages(args)
        responses(args)
        set_mock_behavior(opts.mock_url, opts.tools_behavior)
        messages_tools(args)
        responses_tools(args)
        chat_tools(args)
        set_mock_behavior(opts.mock_url, opts.reasoning_behavior)
        reasoning(args)
    print("sdk ok")


if __name__ == "__main__":
    main()
