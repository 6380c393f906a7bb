#!/bin/sh
# `mlaserve "$@" --backend $MLA_TEST_BACKEND` with mlaserve at $MLA_TEST_EXE: lets
# tests/model/check_logits.py drive the worker processes of a chosen backend.
exec "$MLA_TEST_EXE" "$@" --backend "$MLA_TEST_BACKEND"
