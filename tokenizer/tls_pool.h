/*
 * tls_pool.h - the per-thread objects of an encoder handle, private to
 * tokenizer/: the byte-level BPE encoder's scratch (bpe_scratch.c) and the
 * sentencepiece encoder's word caches (fastenc.c) are both kept this way.
 *
 * A handle is shared by every encoding thread and immutable; what a thread
 * needs to itself (buffers, a word cache, counters) is an object of the
 * handle's pool, made on the thread's first call and found again through a
 * thread-specific key. When the thread ends, its object stays in the pool,
 * free for the next thread that asks (a build's OpenMP teams come and go;
 * their caches stay warm), and every object is freed with the handle.
 *
 * Objects embed a tks__tls_obj as their first member. Thread safety: get is
 * called by any thread at any time; sum takes the pool's mutex and reads
 * every object's counters while their threads may be writing them (counts
 * for a report, read after the encoding they count); init and free are the
 * handle's own, called once.
 */
#ifndef TKS_TOKENIZER_TLS_POOL_H
#define TKS_TOKENIZER_TLS_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tks__tls_obj {
    struct tks__tls_obj *next_all; /* the pool's list */
    int in_use;                    /* owned by a live thread */
} tks__tls_obj;

typedef struct tks__tls_pool {
    pthread_key_t key;
    pthread_mutex_t mu;
    int live;                      /* key and mu are initialized */
    tks__tls_obj *all;             /* every object ever made, freed with the pool */
} tks__tls_pool;

/* Makes the pool's key and mutex. 0, or TKS_ERR_NOMEM (no key left; nothing
 * to free). */
int tks__tls_pool_init(tks__tls_pool *p);

/* This thread's object: the one it holds, else a free one of the pool, else
 * make(ctx)'s (NULL when out of memory), held by the thread until it ends.
 * NULL when none could be had. */
tks__tls_obj *tks__tls_pool_get(tks__tls_pool *p, tks__tls_obj *(*make)(void *ctx), void *ctx);

/* Adds, for every object of the pool, the n uint64_t counters at byte offset
 * `off` in it to sum[0..n) (the caller zeroes sum). No-op on a pool never
 * initialized. */
void tks__tls_pool_sum(tks__tls_pool *p, size_t off, uint64_t *sum, size_t n);

/* Frees every object with destroy and the key and mutex; the pool is then
 * as never initialized. Accepts a pool never initialized. */
void tks__tls_pool_free(tks__tls_pool *p, void (*destroy)(tks__tls_obj *));

#endif
