"""LangChain's ChatOpenAI and ChatAnthropic against Sluice (tests/e2e/agents.rs).

Usage: langchain_client.py BASE_URL KEY OPENAI_MODEL ANTHROPIC_MODEL

For each chat model, one invoke and one stream; prints `<provider> <mode> <JSON text>` per
call and exits 0, or prints the error and exits 1.
"""

import json
import sys

from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI


def text_of(content):
    """The text of a message's content (a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)


def main():
    base, key, openai_model, anthropic_model = sys.argv[1:5]
    models = [
        ("openai-chat", ChatOpenAI(base_url=f"{base}/v1", api_key=key, model=openai_model,
                                   max_retries=0, timeout=30)),
        ("anthropic", ChatAnthropic(base_url=base, api_key=key, model=anthropic_model,
                                    max_tokens=256, max_retries=0, timeout=30)),
    ]
    for name, chat in models:
        msg = chat.invoke("Say hello.")
        print(f"{name} invoke {json.dumps(text_of(msg.content))}", flush=True)
        streamed = "".join(text_of(chunk.content) for chunk in chat.stream("Say hello."))
        print(f"{name} stream {json.dumps(streamed)}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - every failure is reported to the test
        print(f"langchain failed: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
