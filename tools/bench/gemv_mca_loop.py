#!/usr/bin/env python3
"""gemv_mca_loop.py — cut one hot loop out of an object file as llvm-mca input (tools/bench/gemv-mca.sh).

usage: gemv_mca_loop.py OBJECT SYMBOL [--need REGEX:N ...] [--not REGEX ...] [--inner N]

Disassembles SYMBOL (objdump, AT&T; a SYMBOL not in the object by that name is looked up in its
symbol table as a substring: a template instance or a compiler's clone), finds its loops (backward branches), keeps those whose body
has at least N instructions matching each --need REGEX (on the mnemonic + operands) and none
matching a --not REGEX, and prints the smallest such loop's body, one iteration, as assembly that
llvm-mca reads: addresses and comments dropped, branch targets replaced by one local label. A
loop with loops inside it is printed with each outermost inner loop's body N times (--inner N,
its trip count per outer iteration; default 1, and a note on stderr). Forward branches are
followed through (llvm-mca sees one straight sequence). Exits 1 with a message when no loop
matches."""
import re
import subprocess
import sys


def resolve(obj, sym):
    names = subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout.split()
    if sym in names:
        return sym
    hits = [n for n in names if sym in n]
    return hits[0] if hits else sym


def disasm(obj, sym):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--disassemble=" + sym, obj],
                         check=True, capture_output=True, text=True).stdout
    insns = []
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if not m or m.group(2).startswith("(bad)"):
            continue
        text = re.sub(r"\s+#.*$", "", m.group(2)).strip()
        text = re.sub(r"^(cs|ds|data16)\s+", "", text)
        if not text:
            continue
        insns.append((int(m.group(1), 16), text))
    if not insns:
        sys.exit("gemv_mca_loop.py: no instructions for symbol %s in %s (is it in the object? nm %s)" % (sym, obj, obj))
    return insns


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    obj, sym, need, excl, reps = args[0], args[1], [], [], 0
    i = 2
    while i < len(args):
        if args[i] == "--need" and i + 1 < len(args):
            rx, _, n = args[i + 1].rpartition(":")
            need.append((re.compile(rx), int(n)))
            i += 2
        elif args[i] == "--inner" and i + 1 < len(args):
            reps = int(args[i + 1])
            i += 2
        elif args[i] == "--not" and i + 1 < len(args):
            excl.append(re.compile(args[i + 1]))
            i += 2
        else:
            sys.exit("gemv_mca_loop.py: unknown argument %r\n%s" % (args[i], __doc__))
    insns = disasm(obj, resolve(obj, sym))
    index = {a: k for k, (a, _) in enumerate(insns)}
    loops = []
    for k, (addr, text) in enumerate(insns):
        m = re.match(r"^j\w+\s+([0-9a-f]+)\b", text)
        if m and int(m.group(1), 16) <= addr and int(m.group(1), 16) in index:
            loops.append((index[int(m.group(1), 16)], k))
    best = None
    for s, e in loops:
        body = [t for _, t in insns[s:e + 1]]
        if any(rx.search(t) for rx in excl for t in body):
            continue
        if all(sum(1 for t in body if rx.search(t)) >= n for rx, n in need):
            if best is None or e - s < best[1] - best[0]:
                best = (s, e)
    if best is None:
        sys.exit("gemv_mca_loop.py: no loop of %s in %s has %s%s" % (
            sym, obj, ", ".join("%d x /%s/" % (n, rx.pattern) for rx, n in need),
            "".join(" and no /%s/" % rx.pattern for rx in excl)))
    s, e = best
    inner = [(a, b) for a, b in loops if s <= a and b < e and (a, b) != best]
    top = [(a, b) for a, b in inner if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in inner)]
    if top and not reps:
        print("gemv_mca_loop.py: %s: the loop has %d loop(s) inside; each is counted once (--inner N)" % (sym, len(top)),
              file=sys.stderr)
    reps = reps or 1
    print(".text")
    print("Lloop:")
    k = s
    while k <= e:
        span = next(((a, b) for a, b in top if a == k), None)
        times, stop = (reps, span[1]) if span else (1, k)
        for _ in range(times):
            for _, t in insns[k:stop + 1]:
                t = re.sub(r"^(j\w+)\s+[0-9a-f]+\b.*$", r"\1 Lloop", t)
                t = re.sub(r"\s*<[^>]*>", "", t)
                print("\t" + t)
        k = stop + 1


if __name__ == "__main__":
    main()
