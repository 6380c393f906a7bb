/* Minimal assertion helpers for the C unit tests (each test is one executable run by ctest).
 * CHECK records a failure and continues; REQUIRE stops the test. The program's exit status is
 * the verdict, and it prints "N passed, N failed" at the end. */
#ifndef MLA_TEST_H
#define MLA_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mla_test_pass_ = 0, mla_test_fail_ = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            mla_test_pass_++;                                                         \
        } else {                                                                      \
            mla_test_fail_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                             \
    } while (0)

#define CHECKF(cond, ...)                                                             \
    do {                                                                              \
        if (cond) {                                                                   \
            mla_test_pass_++;                                                         \
        } else {                                                                      \
            mla_test_fail_++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

#define REQUIRE(cond)                                                                 \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                  \
        }                                                                             \
        mla_test_pass_++;                                                             \
    } while (0)

static inline int mla_test_finish(void) {
    printf("%d passed, %d failed\n", mla_test_pass_, mla_test_fail_);
    return mla_test_fail_ ? 1 : 0;
}

#endif
