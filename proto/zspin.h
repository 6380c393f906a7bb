/* zspin: zmq_poll that spins before it sleeps. A step loop on a GPU hands every step through
 * several threads (coordinator caller -> coordinator I/O -> worker I/O -> worker compute and back);
 * each blocking wait costs a thread wake-up (tens of microseconds on a VM, more under load) per
 * hop per step. zspin_poll first polls without waiting (yielding the core between polls, so that
 * spinning threads never starve the one that has to answer) for up to spin_us microseconds: a
 * message arriving within that window is taken at once; then it blocks as zmq_poll does. The spin
 * length: zspin_default(). No state; thread-safe as zmq_poll is (each socket in one thread). */
#ifndef ZSPIN_H
#define ZSPIN_H

#include <zmq.h>

/* As zmq_poll(items, n, timeout_ms), after up to spin_us microseconds of non-blocking polls
 * (spin_us <= 0: zmq_poll alone). */
int zspin_poll(zmq_pollitem_t *items, int n, long timeout_ms, long spin_us);

/* The spin of the step loop's waits: spin_us when >= 0 (--spin-us; 0 turns spinning off); else
 * 2000 us for the cuda backend (a GPU step leaves its host threads idle; one spinning core per hop
 * buys the wake-ups back) and 0 for the others (the CPU backend's threads compute). */
long zspin_default(const char *backend, long spin_us);

#endif
