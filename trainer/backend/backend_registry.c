/*
 * backend_registry.c - the backends a program can run: the CPU reference,
 * always, and the kinds the program registered (trainer.h,
 * tks_backend_register). The factory, tks_backend_create, picks one by name.
 */
#include <string.h>

#include "common/tks.h"
#include "trainer/backend/backend.h"
#include "trainer/trainer.h"

#define MAX_KINDS 8

static const tks_backend_kind *kinds[MAX_KINDS] = {&tks_cpu_backend_kind};
static int n_kinds = 1;

int tks_backend_register(const tks_backend_kind *kind) {
    if (!kind) return 0;
    for (int i = 0; i < n_kinds; i++)
        if (!strcmp(kinds[i]->name, kind->name)) return kinds[i] == kind ? 0 :
            tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                     "a second backend named %s was registered; each name may be registered once",
                     kind->name);
    if (n_kinds == MAX_KINDS)
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "backend %s: the registry holds %d kinds at most", kind->name, MAX_KINDS);
    kinds[n_kinds++] = kind;
    return 0;
}

const tks_backend_kind *tks_backend_find(const char *name) {
    for (int i = 0; name && i < n_kinds; i++)
        if (!strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}

int tks_backend_create(const char *device, int threads, tks_backend **out) {
    *out = NULL;
    if (!device) device = "auto";
    const tks_backend_kind *k = NULL;
    if (!strcmp(device, "auto")) {
        for (int i = 1; i < n_kinds && !k; i++)
            if (kinds[i]->device_count() > 0) k = kinds[i];
        if (!k) k = &tks_cpu_backend_kind;
    } else if (!(k = tks_backend_find(device))) {
        if (!strcmp(device, "cuda"))
            return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                            "--device cuda: this build has no CUDA backend (trainer/cuda is not "
                            "compiled in); use --device cpu, or rebuild with the CUDA toolkit "
                            "installed (cmake -DTKS_CUDA=ON)");
        return tks_fail(TKS_ERR_ARG, NULL, TKS_NONE, TKS_NONE,
                        "--device %s: unknown device; use cpu, cuda or auto", device);
    }
    return k->create(threads, out);
}
