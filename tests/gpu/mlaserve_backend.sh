#!/bin/sh
# `mlaserve "$@" --backend $MLASERVE_TEST_BACKEND` with mlaserve at $MLASERVE_TEST_EXE: lets
# tests/model/check_logits.py drive the worker processes of a chosen backend.
exec "$MLASERVE_TEST_EXE" "$@" --backend "$MLASERVE_TEST_BACKEND"
