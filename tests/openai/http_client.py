#!/usr/bin/env python3
"""A plain HTTP client of the OpenAI-compatible API, Python's standard library only.

Usage: http_client.py URL BODY_JSON [TOKEN]
POSTs BODY_JSON to URL. A streamed reply (text/event-stream) is read event by event: each
"data:" line must be JSON (or [DONE], last); the script prints one JSON object with the
HTTP status, the text pieces, the finish_reason, the usage, whether [DONE] ended the stream,
and any protocol error it saw. A plain reply prints {"status", "body"}.
"""
import json
import os
import sys
import urllib.error
import urllib.request


def main():
    url, body = sys.argv[1], sys.argv[2]
    headers = {"Content-Type": "application/json"}
    if len(sys.argv) > 3:
        headers["Authorization"] = "Bearer " + sys.argv[3]
    request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        response = urllib.request.urlopen(request, timeout=float(os.environ.get("LAZYKV_HTTP_TIMEOUT_S", "60")))
    except urllib.error.HTTPError as error:
        print(json.dumps({"status": error.code, "body": json.loads(error.read() or b"null")}))
        return
    if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
        print(json.dumps({"status": response.status, "body": json.loads(response.read())}))
        return
    out = {"status": response.status, "pieces": [], "finish_reason": None, "usage": None, "done": False,
           "roles": [], "problems": [], "error": None, "ids": set()}
    for raw in response:
        line = raw.decode("utf-8").rstrip("\n")
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data: "):
            out["problems"].append("not a data line: " + line)
            continue
        data = line[len("data: "):]
        if out["done"]:
            out["problems"].append("data after [DONE]")
        if data == "[DONE]":
            out["done"] = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            out["error"] = chunk["error"]
            continue
        out["ids"].add(chunk["id"])
        if chunk.get("usage") is not None:
            out["usage"] = chunk["usage"]
        for choice in chunk["choices"]:
            if "delta" in choice:
                if "role" in choice["delta"]:
                    out["roles"].append(choice["delta"]["role"])
                piece = choice["delta"].get("content")
            else:
                piece = choice.get("text")
            if piece:
                if out["finish_reason"] is not None:
                    out["problems"].append("text after the finish_reason")
                out["pieces"].append(piece)
            if choice.get("finish_reason") is not None:
                out["finish_reason"] = choice["finish_reason"]
    out["ids"] = sorted(out["ids"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
