/* buildinfo: what this build is, for `--version`, the mlaserve_build_info metric and the
 * protobuf Hello: the version (CMake's project version), the git commit the build was configured
 * at ("-dirty" when the tree had changes then; "unknown" outside a git checkout), the build type
 * and the CUDA architectures built ("" without CUDA). Static strings; nothing to free. */
#ifndef BUILDINFO_H
#define BUILDINFO_H

#include <stdio.h>

const char *buildinfo_version(void);
const char *buildinfo_commit(void);
const char *buildinfo_type(void);
const char *buildinfo_cuda_archs(void);
/* "PROG VERSION (commit C, BUILD_TYPE, CUDA sm_90;100;120 | CPU only)\n" on f */
void buildinfo_print(FILE *f, const char *prog);

#endif
