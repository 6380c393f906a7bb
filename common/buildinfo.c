/* buildinfo: see buildinfo.h. */
#include "buildinfo.h"

#include "mla_buildinfo_gen.h"

const char *buildinfo_version(void) { return MLA_BUILD_VERSION; }
const char *buildinfo_commit(void) { return MLA_BUILD_COMMIT; }
const char *buildinfo_type(void) { return MLA_BUILD_TYPE; }
const char *buildinfo_cuda_archs(void) { return MLA_BUILD_CUDA_ARCHS; }

void buildinfo_print(FILE *f, const char *prog) {
    fprintf(f, "%s %s (commit %s, %s, %s%s)\n", prog, MLA_BUILD_VERSION, MLA_BUILD_COMMIT, MLA_BUILD_TYPE,
            MLA_BUILD_CUDA_ARCHS[0] ? "CUDA sm_" : "CPU only", MLA_BUILD_CUDA_ARCHS);
}
