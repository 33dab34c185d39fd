#!/usr/bin/env bash
# The repository stands on its own: every docs/*.md that code, tests or docs
# name exists, and nothing cites documents that live outside the repository.
# Usage: test_docs.sh REPO_ROOT
set -uo pipefail
cd "$1" || exit 2
fails=0
files=$(git ls-files 2>/dev/null) || files=$(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
while read -r ref; do
  [[ -e $ref ]] || { echo "FAIL: $ref is referenced but not in the repository:"; grep -ln -- "$ref" $files | head -3 | sed 's/^/  in /'; fails=$((fails + 1)); }
done < <(grep -ohE '\bdocs/[A-Za-z0-9_.-]+\.md\b' $files 2>/dev/null | sort -u)
# documents outside the repository
outside=$(grep -lE '(^|[^A-Za-z/])(CONTEXT|STYLE)\.md|\.\./shared/' $files 2>/dev/null | grep -v '^tests/test_docs.sh$')
if [[ -n $outside ]]; then
  echo "FAIL: these files cite documents that are not in the repository:"; echo "$outside" | sed "s/^/  /"; echo
  fails=$((fails + 1))
fi
[[ $fails -eq 0 ]] && echo "docs: every referenced file exists, nothing cited from outside" || echo "docs: $fails problem(s)" >&2
exit $((fails > 0))
