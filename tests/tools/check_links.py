#!/usr/bin/env python3
"""check_links.py FILE.md... — every relative link of each Markdown file resolves: the file or
directory exists (relative to the linking file), and a `#fragment` names a heading of the target
(GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats).
Links inside fenced code blocks and inline code are not links. Prints each broken link on stderr as
`FILE:LINE: TARGET: why` and exits 1 if there is any; stdlib only."""
import os
import re
import sys

LINK = re.compile(r'\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
FENCE = re.compile(r'^\s*(```|~~~)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def lines_outside_code(text):
    """(line number, line with inline code removed) for every line outside fenced blocks."""
    fence = None
    for n, line in enumerate(text.split('\n'), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r'(`+)(.+?)\1', '', line)


def slug(title):
    t = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', title)  # a link in a heading counts by its text
    t = t.replace('`', '').strip().lower()
    t = re.sub(r'[^\w\- ]', '', t)
    return t.replace(' ', '-')


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        out = set()
        with open(path, encoding='utf-8') as f:
            text = f.read()
        fence = None
        for line in text.split('\n'):
            m = FENCE.match(line)
            if m:
                fence = m.group(1) if fence is None else (None if m.group(1) == fence else fence)
                continue
            h = HEADING.match(line) if fence is None else None
            if not h:
                continue
            s = slug(h.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f'{s}-{k}')
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', text):
            out.add(m.group(1))
        _anchors[path] = out
    return _anchors[path]


def check(md):
    bad = 0
    with open(md, encoding='utf-8') as f:
        text = f.read()
    base = os.path.dirname(md)
    for n, line in lines_outside_code(text):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):  # http:, https:, mailto:
                continue
            path, _, frag = target.partition('#')
            dest = os.path.normpath(os.path.join(base, path)) if path else md
            why = None
            if not os.path.exists(dest):
                why = 'no such file or directory'
            elif frag and dest.endswith('.md') and frag not in anchors(dest):
                why = f'no heading with anchor #{frag} in {dest}'
            if why:
                print(f'{md}:{n}: {target}: {why}', file=sys.stderr)
                bad += 1
    return bad


if __name__ == '__main__':
    total = sum(check(p) for p in sys.argv[1:])
    sys.exit(1 if total else 0)
