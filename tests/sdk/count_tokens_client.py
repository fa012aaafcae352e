"""End-to-end check of Sluice's `POST /v1/messages/count_tokens` with the official
`anthropic` Python package (`client.messages.count_tokens`, as Claude Code calls it).

Run by `tests/e2e/count_tokens.rs` against a real Sluice in front of the mock upstream:

    python tests/sdk/count_tokens_client.py --base-url http://127.0.0.1:PORT \
        --key VIRTUAL_KEY --model acme/claude --expect-method provider

Exits 0 and prints `sdk count ok` when every check passed; any failure raises (non-zero
exit).
"""

import argparse

import anthropic


def check(cond, what):
    if not cond:
        raise AssertionError(what)


TOOLS = [
    {
        "name": "get_weather",
        "description": "The current weather of a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--expect-method", required=True, choices=["provider", "estimate"])
    args = p.parse_args()

    # The SDK appends /v1/messages/count_tokens to the base URL and sends `x-api-key`.
    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=args.key, max_retries=0, timeout=20.0
    )

    short = client.messages.count_tokens(
        model=args.model,
        system="You are terse.",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
    )
    check(type(short).__name__ == "MessageTokensCount", f"type {type(short)!r}")
    check(isinstance(short.input_tokens, int), f"input_tokens {short.input_tokens!r}")
    check(short.input_tokens > 0, f"input_tokens {short.input_tokens}")
    print(f"count_tokens: {short.input_tokens}")

    # A longer history with a tool call and its result counts more; the raw response says
    # how it was counted.
    raw = client.messages.with_raw_response.count_tokens(
        model=args.model,
        system="You are terse.",
        messages=[
            {"role": "user", "content": "What is the weather in Paris? " * 10},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "Sunny and 21 degrees",
                    }
                ],
            },
        ],
        tools=TOOLS,
    )
    method = raw.headers.get("x-sluice-token-count")
    check(method == args.expect_method, f"counted by {method!r}, expected {args.expect_method!r}")
    longer = raw.parse()
    check(
        longer.input_tokens > short.input_tokens,
        f"longer prompt {longer.input_tokens} <= {short.input_tokens}",
    )
    print(f"count_tokens (raw): {longer.input_tokens} by {method}")

    # Errors arrive as the SDK's own exception classes.
    try:
        client.messages.count_tokens(
            model="acme/does-not-exist",
            messages=[{"role": "user", "content": "hi"}],
        )
        raise AssertionError("an unknown model was counted")
    except anthropic.NotFoundError as e:
        check(e.status_code == 404, f"status {e.status_code}")
        check(e.body["error"]["type"] == "not_found_error", f"body {e.body!r}")
    bad = anthropic.Anthropic(
        base_url=args.base_url, api_key="sk-wrong-key-0000", max_retries=0, timeout=20.0
    )
    try:
        bad.messages.count_tokens(
            model=args.model, messages=[{"role": "user", "content": "hi"}]
        )
        raise AssertionError("a bad key was accepted")
    except anthropic.AuthenticationError as e:
        check(e.status_code == 401, f"status {e.status_code}")

    print("sdk count ok")


if __name__ == "__main__":
    main()
