"""Shared helpers of the client tests: the server under test, raw HTTP for the expectations the
clients' answers are compared with, and bounded checks that count failures."""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

URL = os.environ["PLN_URL"]            # http://127.0.0.1:PORT of a running `pollen serve`
MODEL = os.environ["PLN_MODEL"]        # its model id
POLLEN = os.environ.get("PLN_POLLEN")  # the pollen binary (for `pollen generate` expectations)
SET = os.environ.get("PLN_SET")        # the shard set the server serves
_failed = 0
_passed = 0


def check(cond, what):
    global _failed, _passed
    if cond:
        _passed += 1
        print(f"ok   {what}")
    else:
        _failed += 1
        print(f"FAIL {what}")


def done(name):
    print(f"{name}: {_passed} passed, {_failed} failed")
    sys.exit(1 if _failed else 0)


def post(path, body):
    """Raw POST; returns (status, parsed JSON or text)."""
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read().decode()
        status = e.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


def generate_ids(prompt, n):
    """Greedy ids from `pollen generate` on the same set (the C side's own answer)."""
    out = subprocess.run([POLLEN, "generate", SET, "--prompt", prompt, "--max-new-tokens", str(n),
                          "--temperature", "0", "--json", "--quiet"], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)["results"][0]["ids"]
