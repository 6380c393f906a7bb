/* fdlink: length-prefixed frames over a stream socket that a poll loop drives without ever
 * blocking: the coordinator and each worker it starts on its own host talk over one (a
 * socketpair made at the spawn), so that a step's plan and result cross between two threads
 * that poll, with no ZeroMQ I/O thread to wake on either side.
 *
 * A frame on the stream is its length (8 bytes, little endian) then its bytes. fdlink_send
 * queues a frame and writes what the socket takes now; the rest goes out on fdlink_flush, which
 * the loop calls when the descriptor is writable (poll for POLLOUT while fdlink_pending).
 * fdlink_recv reads what has arrived and returns one complete frame at a time. A frame longer
 * than the link's max_frame (either way) is an error: the stream cannot be trusted after it.
 *
 * Ownership: fdlink_new takes the descriptor (made non-blocking here); fdlink_free closes it
 * and frees the buffers. A frame returned by fdlink_recv is the caller's (free()). One thread
 * at a time per link. */
#ifndef FDLINK_H
#define FDLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mla_err.h"

typedef struct fdlink fdlink;

/* NULL with *err set when fd cannot be made non-blocking */
fdlink *fdlink_new(int fd, size_t max_frame, mla_err *err);
void fdlink_free(fdlink *l);
int fdlink_fd(const fdlink *l);

/* Queues one frame of n bytes (a copy) and writes as much as the socket takes now. MLA_ERR
 * when n exceeds max_frame or the peer is gone (no more writes from then on; the frames the peer
 * sent before it went can still be read). */
int fdlink_send(fdlink *l, const void *buf, size_t n, mla_err *err);

/* Writes queued bytes until the socket would block. MLA_ERR when the peer is gone (as for
 * fdlink_send). */
int fdlink_flush(fdlink *l, mla_err *err);

/* bytes queued and not yet written */
size_t fdlink_pending(const fdlink *l);

/* What a poll loop does when the link's descriptor polls ready: when writable, the queued bytes
 * go out (fdlink_flush); then each whole frame that has arrived, up to max_frames of them, goes
 * to on_frame(ctx, frame, n) (the frame is freed after the call) until on_frame returns nonzero.
 * MLA_ERR when the link failed (frames handed out before stay handled); a failed write still
 * hands out the frames that had arrived, then returns its error. */
int fdlink_pump(fdlink *l, bool writable, int max_frames, int (*on_frame)(void *ctx, const uint8_t *frame, size_t n),
                void *ctx, mla_err *err);

/* 1: *frame (malloc'd, the caller's) holds one whole frame of *n bytes; 0: no whole frame yet
 * (nothing more to read now); MLA_ERR: the peer closed the link ("closed" in the message when
 * cleanly at a frame boundary), a read failed, or a frame is too long. Call it until it returns
 * 0 after the descriptor polls readable. */
int fdlink_recv(fdlink *l, uint8_t **frame, size_t *n, mla_err *err);

#endif
