#!/usr/bin/env bash
# The paper's 1.5B run: train_qwen2.5_math.sh, which holds its settings and usage, with the size filled in.
exec "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/train_qwen2.5_math.sh" 1.5b "$@"
