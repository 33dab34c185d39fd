# The bundled real corpus: text that Debian packages install (scripts/install-deps.sh).
#   dict-gcide:     GNU Collaborative International Dictionary of English, one
#                   dictzip file (~13 MB compressed, ~40 MB of English), entries
#                   separated by blank lines
#   python3.11-doc: reStructuredText sources of the Python 3.11 documentation
#                   (~500 files, ~12 MB)
TKS_CORPUS=(/usr/share/dictd/gcide.dict.dz /usr/share/doc/python3.11/html/_sources)
TKS_VOCAB=8000
for p in "${TKS_CORPUS[@]}"; do
  if [[ ! -e $p ]]; then
    echo "corpus: $p is missing: run scripts/install-deps.sh (packages dict-gcide, python3.11-doc)" >&2
    exit 2
  fi
done
