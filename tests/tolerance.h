/* tolerance.h - rounding-error bounds from which the numeric tests derive
 * their tolerances, so that a tolerance holds on every CPU and BLAS build and
 * is never tuned to one machine's rounding.
 *
 * u is the unit roundoff of round-to-nearest binary32 (2^-24) or binary64
 * (2^-53). gamma(n) = n u / (1 - n u) bounds the relative error of a sum or
 * dot product of n terms computed in that precision, in any order, with or
 * without FMA, relative to the sum of the terms' magnitudes (Higham, "Accuracy
 * and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and eq. (3.5)).
 * Two computations of one quantity that differ only in the order of their
 * sums (BLAS blocking, a batch split into micro-batches) therefore differ by
 * at most 2 gamma(n). */
#ifndef TKS_TEST_TOLERANCE_H
#define TKS_TEST_TOLERANCE_H

#define TOL_U32 5.9604644775390625e-08 /* 2^-24 */
#define TOL_U64 1.1102230246251565e-16 /* 2^-53 */

static inline double gamma_f32(double n) { return n * TOL_U32 / (1 - n * TOL_U32); }
static inline double gamma_f64(double n) { return n * TOL_U64 / (1 - n * TOL_U64); }

#endif
