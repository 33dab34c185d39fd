#!/usr/bin/env python3
"""Call structure of tokshard's sources, for tests/test_layering.sh.

  layering_calls.py circles ROOT DIR...   files of one folder that call each
      other, directly or round a longer loop (strongly connected components
      of the folder's call graph: file A -> file B when A names a function
      that B defines); one line per circle, exit 1 when there is one
  layering_calls.py long ROOT LIMIT DIR...  functions longer than LIMIT lines
      (opening to closing brace), one line each, exit 1 when there is one
  layering_calls.py rooms ROOT FOLDER=LEVEL...  calls between the folders
      named go down only: a file of a folder names no function defined in a
      folder of the same or a higher level; one line per call that does not,
      exit 1 when there is one

Sources are read as text: comments, strings and character literals are
blanked first, then a definition is a name followed by a parameter list and
a brace at nesting depth 0, and a use is any other occurrence of the name.
Folders are compared file by file (each DIR and each folder below it on its
own); headers only declare, so they take no part.
"""
import os
import re
import sys

EXT = ('.c', '.cc', '.cpp', '.cu')
IDENT = re.compile(r'[A-Za-z_]\w*')


def blank(src):
    """src with comments, strings and char literals replaced by spaces
    (newlines kept, so line numbers stay)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
        elif src[i] in '"\'':
            q, j = src[i], i + 1
            while j < n and src[j] != q and src[j] != '\n':
                j += 2 if src[j] == '\\' else 1
            j += 1
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(re.sub(r'[^\n]', ' ', src[i:j]))
        i = j
    return ''.join(out)


def functions(text):
    """(name, is_static, first_line, last_line) of each function defined in
    text (already blanked). A definition: at depth 0, `name (...)` followed
    by `{`, the name not a keyword."""
    res, depth, i, n = [], 0, 0, len(text)
    kw = {'if', 'for', 'while', 'switch', 'return', 'sizeof', 'do'}
    while i < n:
        c = text[i]
        if c == '#' and (i == 0 or text[i - 1] == '\n'):      # a preprocessor line
            while i < n and text[i] != '\n':
                i += 2 if text.startswith('\\\n', i) else 1
            continue
        if c == '{':
            depth += 1
        elif c == '}':
            depth -= 1
        elif depth == 0 and c == '(':
            m = re.search(r'([A-Za-z_]\w*)\s*$', text[:i])
            j, d = i, 0
            while j < n:                                      # the matching ')'
                d += {'(': 1, ')': -1}.get(text[j], 0)
                j += 1
                if d == 0:
                    break
            k = j
            while k < n and (text[k].isspace() or text[k:k + 5] == 'const'):
                k += 5 if text[k:k + 5] == 'const' else 1
            if m and m.group(1) not in kw and k < n and text[k] == '{':
                line_start = text.rfind('\n', 0, m.start()) + 1
                prefix = text[line_start:m.start()]
                # the declaration may start lines above: walk back to a blank line
                p = line_start
                while p > 0:
                    q = text.rfind('\n', 0, p - 1) + 1
                    prev = text[q:p - 1]
                    if not prev.strip() or prev.rstrip().endswith((';', '}', '{')) or prev.startswith('#'):
                        break
                    prefix = prev + ' ' + prefix
                    p = q
                static = re.search(r'\bstatic\b', prefix) is not None
                e, d = k, 0                                   # the matching '}'
                while e < n:
                    d += {'{': 1, '}': -1}.get(text[e], 0)
                    e += 1
                    if d == 0:
                        break
                first = text.count('\n', 0, k) + 1
                last = text.count('\n', 0, e - 1) + 1
                res.append((m.group(1), static, first, last))
                i = e
                continue
        i += 1
    return res


def sources(root, dirs):
    """{folder: [file, ...]} for every folder at or below each dir."""
    out = {}
    for d in dirs:
        for base, _, names in os.walk(os.path.join(root, d)):
            files = sorted(os.path.join(base, x) for x in names if x.endswith(EXT))
            if files:
                out[os.path.relpath(base, root)] = files
    return out


def circles(root, dirs):
    bad = 0
    for folder, files in sorted(sources(root, dirs).items()):
        texts = {f: blank(open(f, encoding='utf-8', errors='replace').read()) for f in files}
        defined, twice = {}, set()                            # extern name -> file
        for f, t in texts.items():
            for name, static, _, _ in functions(t):
                if not static:
                    if name in defined and defined[name] != f:
                        twice.add(name)
                    defined[name] = f
        # a name defined in two files is one of two builds (cuda_stub.c stands
        # in for the CUDA backend where there is no nvcc): no edge to either
        for name in twice:
            del defined[name]
        edges = {f: set() for f in files}
        for f, t in texts.items():
            for name in set(IDENT.findall(t)):
                g = defined.get(name)
                if g and g != f:
                    edges[f].add(g)
        # strongly connected components (Tarjan)
        index, low, stack, on, comps, cnt = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = cnt[0]
            cnt[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

        for v in files:
            if v not in index:
                visit(v)
        for comp in comps:
            bad = 1
            names = [os.path.relpath(f, root) for f in comp]
            why = []
            for a in comp:
                for b in comp:
                    if b in edges[a]:
                        uses = sorted(n for n, g in defined.items() if g == b and
                                      re.search(r'\b%s\b' % n, texts[a]))
                        why.append('%s -> %s (%s)' % (os.path.basename(a), os.path.basename(b),
                                                      ', '.join(uses[:3])))
            print('circle in %s: %s; %s' % (folder, ' '.join(names), '; '.join(why)))
    return bad


def long_functions(root, limit, dirs):
    bad = 0
    for folder, files in sorted(sources(root, dirs).items()):
        for f in files:
            t = blank(open(f, encoding='utf-8', errors='replace').read())
            for name, _, first, last in functions(t):
                if last - first + 1 > limit:
                    bad = 1
                    print('%s:%d: %s is %d lines (limit %d)' % (os.path.relpath(f, root), first, name,
                                                              last - first + 1, limit))
    return bad


def rooms(root, specs):
    level = {}
    for spec in specs:
        folder, lvl = spec.rsplit('=', 1)
        level[folder] = int(lvl)
    texts, defined = {}, {}
    for folder in level:
        for f in sorted(os.listdir(os.path.join(root, folder))):
            path = os.path.join(root, folder, f)
            if f.endswith(EXT) and os.path.isfile(path):
                texts[(folder, path)] = t = blank(open(path, encoding='utf-8', errors='replace').read())
                for name, static, _, _ in functions(t):
                    if not static:
                        defined.setdefault(name, set()).add(folder)
    bad = 0
    for (folder, path), t in sorted(texts.items()):
        for name in sorted(set(IDENT.findall(t))):
            for other in sorted(defined.get(name, ())):
                if other != folder and folder not in defined[name] and level[other] >= level[folder]:
                    bad = 1
                    print('%s calls %s of %s (level %d, not below %s\'s %d)' %
                          (os.path.relpath(path, root), name, other, level[other], folder, level[folder]))
    return bad


if __name__ == '__main__':
    if len(sys.argv) >= 4 and sys.argv[1] == 'rooms':
        sys.exit(rooms(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) >= 4 and sys.argv[1] == 'circles':
        sys.exit(circles(sys.argv[2], sys.argv[3:]))
    if len(sys.argv) >= 5 and sys.argv[1] == 'long':
        sys.exit(long_functions(sys.argv[2], int(sys.argv[3]), sys.argv[4:]))
    sys.exit('usage: layering_calls.py circles ROOT DIR... | long ROOT LIMIT DIR... | '
             'rooms ROOT FOLDER=LEVEL...')
