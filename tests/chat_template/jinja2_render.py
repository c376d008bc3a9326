#!/usr/bin/python3
"""Reference renderer for chat_template_jinja2_test: Python's Jinja2, set up as Hugging Face
transformers sets it up for apply_chat_template (ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, its own tojson filter and the
raise_exception / strftime_now globals).

stdin: {"cases": [{"template": str, "variables": {...}}, ...]}
stdout: [{"ok": rendered} or {"error": message, "raised": bool}, ...] in the same order.
Exit status 3 when jinja2 is not installed (the test skips then).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit(3)


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    request = json.load(sys.stdin)
    compiled = {}
    results = []
    for case in request["cases"]:
        try:
            source = case["template"]
            if source not in compiled:
                compiled[source] = env.from_string(source)
            results.append({"ok": compiled[source].render(**case["variables"])})
        except Raised as e:
            results.append({"error": str(e), "raised": True})
        except Exception as e:  # noqa: BLE001 - every template error is a result here
            results.append({"error": "%s: %s" % (type(e).__name__, e), "raised": False})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
