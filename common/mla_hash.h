/* mla_hash: the 64-bit FNV-1a hash of a byte range, for hash tables and fingerprints (not for
 * anything an adversary could exploit: collisions are easy to make on purpose). Header only. */
#ifndef MLA_HASH_H
#define MLA_HASH_H

#include <stddef.h>
#include <stdint.h>

#define MLA_FNV_BASIS 0xcbf29ce484222325ull

/* h extended by the n bytes at p (start from MLA_FNV_BASIS) */
static inline uint64_t mla_fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif
