/* tls_pool.c - tls_pool.h: per-thread objects of an encoder handle. */
#include <string.h>

#include "common/tks.h"
#include "tokenizer/tls_pool.h"

static void release(void *p) {
    /* the thread is gone: the object stays with the pool for another thread */
    __atomic_store_n(&((tks__tls_obj *)p)->in_use, 0, __ATOMIC_RELEASE);
}

int tks__tls_pool_init(tks__tls_pool *p) {
    memset(p, 0, sizeof *p);
    if (pthread_key_create(&p->key, release)) return TKS_ERR_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    p->live = 1;
    return 0;
}

tks__tls_obj *tks__tls_pool_get(tks__tls_pool *p, tks__tls_obj *(*make)(void *ctx), void *ctx) {
    if (!p->live) return NULL;
    tks__tls_obj *o = pthread_getspecific(p->key);
    if (o) return o;
    pthread_mutex_lock(&p->mu);
    for (o = p->all; o; o = o->next_all)
        if (!__atomic_load_n(&o->in_use, __ATOMIC_ACQUIRE)) break;
    if (!o && (o = make(ctx))) {
        o->next_all = p->all;
        p->all = o;
    }
    if (o) {
        o->in_use = 1;
        if (pthread_setspecific(p->key, o)) o->in_use = 0, o = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    return o;
}

void tks__tls_pool_sum(tks__tls_pool *p, size_t off, uint64_t *sum, size_t n) {
    if (!p->live) return;
    pthread_mutex_lock(&p->mu);
    for (tks__tls_obj *o = p->all; o; o = o->next_all) {
        const uint64_t *c = (const uint64_t *)((const char *)o + off);
        for (size_t i = 0; i < n; i++) sum[i] += c[i];
    }
    pthread_mutex_unlock(&p->mu);
}

void tks__tls_pool_free(tks__tls_pool *p, void (*destroy)(tks__tls_obj *)) {
    if (!p->live) return;
    for (tks__tls_obj *o = p->all, *n; o; o = n) {
        n = o->next_all;
        destroy(o);
    }
    pthread_key_delete(p->key);
    pthread_mutex_destroy(&p->mu);
    memset(p, 0, sizeof *p);
}
