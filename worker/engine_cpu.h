/* engine_cpu: the CPU forward pass (worker/model.h) as a worker engine (worker/engine.h). */
#ifndef ENGINE_CPU_H
#define ENGINE_CPU_H

#include "engine.h"

extern const engine_ops engine_cpu_ops;

#endif
