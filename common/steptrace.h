/* steptrace: timestamps of each step on its way through the serving path, for finding where the
 * time between the engine and the client goes (scripts/steptrace.py reads them).
 *
 * Off unless MLA_STEP_TRACE names a folder (then a mark costs one clock read and one store).
 * Every process that marks writes DIR/steptrace-<pid>.txt at exit: one line "<step> <mark> <ns>"
 * a mark, CLOCK_MONOTONIC nanoseconds (one clock for every process of a host). Up to 1<<16
 * marks a process are kept; later ones are dropped. Thread-safe; the buffer is the module's
 * own (nothing to free). The marks the code sets, in order:
 *   A coordinator, caller: a step plan handed to the I/O thread (coord_step)
 *   B coordinator, I/O thread: the plan taken up, about to go to every rank
 *   C worker, I/O thread: the plan received and decoded
 *   D worker, compute thread: the plan taken up
 *   E worker, compute thread: the result about to go to the I/O thread (after the engine)
 *   F worker, I/O thread: the result taken up, about to go to the coordinator
 *   G coordinator, I/O thread: rank 0's result received
 *   H coordinator, caller: the result back in coord_step */
#ifndef STEPTRACE_H
#define STEPTRACE_H

#include <stdint.h>

void steptrace_mark(uint64_t step, char mark);

#endif
