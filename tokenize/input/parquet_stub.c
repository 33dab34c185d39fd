/* parquet_stub.c - tokenize/parquet.h in a build without Apache Arrow's
 * Parquet reader (-DTKS_PARQUET=OFF, or AUTO where the pyarrow wheel was not
 * found): every Parquet file is refused with the way to get the support. */
#include "common/tks.h"
#include "tokenize/input/parquet.h"

int tks_pq_available(void) { return 0; }

const char *tks_pq_version(void) { return ""; }

int tks_pq_open(const char *path, const char *column, tks_pq **out) {
    (void)column;
    *out = NULL;
    return tks_fail(TKS_ERR_INPUT, path, TKS_NONE, TKS_NONE,
                    "%s is a Parquet file and this tokshard was built without Parquet support: run "
                    "scripts/install-venv.sh (it installs the pyarrow wheel, whose Arrow C++ "
                    "libraries read Parquet) and build again (cmake -DTKS_PARQUET=ON says why "
                    "when it still cannot be built)",
                    path);
}

size_t tks_pq_n_groups(const tks_pq *p) { (void)p; return 0; }

const tks_pq_group *tks_pq_groups(const tks_pq *p) { (void)p; return NULL; }

int tks_pq_start(tks_pq *p, size_t g) { (void)p; (void)g; return TKS_ERR_ARG; }

int tks_pq_next(tks_pq *p, const char **s, size_t *n, int *is_null) {
    (void)p; (void)s; (void)n; (void)is_null;
    return 0;
}

void tks_pq_close(tks_pq *p) { (void)p; }
