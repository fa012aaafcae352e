"""End-to-end check of Sluice's Anthropic Messages and OpenAI Responses endpoints with the
official `anthropic` and `openai` Python packages.

Run by `tests/e2e/sdk_dialects.rs` against a real Sluice in front of the mock upstream:

    python tests/sdk/dialects_client.py --base-url http://127.0.0.1:PORT \
        --key VIRTUAL_KEY --model acme/claude --expect-text "..."

Exits 0 and prints `sdk ok` when every check passed; any failure raises (non-zero exit).
"""

import argparse

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--expect-text", required=True)
    args = ap.parse_args()
    messages(args)
    responses(args)
    print("sdk ok")


if __name__ == "__main__":
    main()
