/* profile.h - per-op timing of a backend (profile.c; tokshard-train
 * --profile N), each timed call priced with the step model's roofline cost
 * of its op (stepmodel.h) for the "model ms" column, so that the prediction
 * and the measurement count the same calls. Private to trainer/. */
#ifndef TKS_PROFILE_H
#define TKS_PROFILE_H

#include <stdint.h>

#include "trainer/backend/backend.h"
#include "trainer/trainer.h"

/* Puts be's compute and transfer ops behind timing wrappers (be->ops is
 * replaced until tks_profile_detach), timed with the kind's timer
 * (backend.h: marks around each op, read once per profiled step) or, for a
 * kind without one, the host clock between syncs. Counting starts with
 * tks_profile_count(1). hw (may be NULL; copied): the roofline whose
 * predicted time of every counted call goes beside its measured one. One
 * backend per process. Errors: TKS_ERR_ARG (one is profiled already), the
 * timer's (TKS_ERR_NOMEM, TKS_ERR_IO). */
int tks_profile_attach(tks_backend *be, const tks_roofline *hw);
/* Gives be its own operations table back (NULL or an unprofiled be: no-op). */
void tks_profile_detach(tks_backend *be);
/* Counts the ops that run from now (on = 1) or stops counting (0: the end
 * of a profiled step; waits for the step's timer marks and adds their
 * times). */
void tks_profile_count(int on);
/* The table of what was counted, slowest op first: op, calls, total ms, ms per
 * step (over `steps`), share of all ops' time, achieved TFLOP/s (ops with
 * matrix products) or GB/s (the rest), and with a roofline the predicted ms
 * and measured / predicted. malloc'd text the caller frees; NULL when out of
 * memory. */
char *tks_profile_report(uint64_t steps);

#endif /* TKS_PROFILE_H */
