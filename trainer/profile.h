/* profile.h - per-op timing of a backend (profile.c; tokshard-train
 * --profile N). Private to trainer/. */
#ifndef TKS_PROFILE_H
#define TKS_PROFILE_H

#include <stdint.h>

#include "backend.h"

/* Puts be's compute and transfer ops behind timing wrappers (be->ops is
 * replaced until tks_profile_detach). Counting starts with
 * tks_profile_count(1). One backend per process. Errors: TKS_ERR_ARG (one is
 * profiled already). */
int tks_profile_attach(tks_backend *be);
/* Gives be its own operations table back (NULL or an unprofiled be: no-op). */
void tks_profile_detach(tks_backend *be);
/* Counts the ops that run from now (on = 1) or stops counting (0). */
void tks_profile_count(int on);
/* The table of what was counted, slowest op first: op, calls, total ms, ms per
 * step (over `steps`), share of all ops' time, achieved TFLOP/s (GEMMs).
 * malloc'd text the caller frees; NULL when out of memory. */
char *tks_profile_report(uint64_t steps);

#endif /* TKS_PROFILE_H */
