# Sourced by scripts/train_*.sh, which differ only in their overrides: the method switch, the run name and the
# dry run behave the same in every run. Call in order:
#
#   recipe_parse_method "$@"            # METHOD (method=<m> anywhere on the line, else $METHOD, else apo);
#                                       # the other arguments in `passthrough`
#   recipe_experiment_name <prefix>     # EXPERIMENT_NAME, unless the caller set it
#   recipe_launch <the script's overrides...>  # runs (or prints) recipe_apo.main with METHOD and EXPERIMENT_NAME
#
# Arrays are expanded as ${a[@]+"${a[@]}"}: under `set -u`, bash before 4.4 (macOS ships 3.2) takes an empty
# "${a[@]}" for an unset variable.

recipe_parse_method() {
    METHOD="${METHOD:-apo}"
    passthrough=()
    local arg
    for arg in "$@"; do
        case "$arg" in
            method=*) METHOD="${arg#method=}" ;;
            *) passthrough+=("$arg") ;;
        esac
    done
    case "$METHOD" in
        grpo | drgrpo | apo) ;;
        *) echo "error: method must be grpo, drgrpo or apo, got '$METHOD'" >&2; exit 2 ;;
    esac
}

# One run folder per method and set of training overrides, so that rerunning a command resumes its own run
# (verl's resume_mode=auto) and a changed setting never resumes another run's checkpoints.
recipe_experiment_name() {
    local arg suffix=""
    local name_args=()
    for arg in ${passthrough[@]+"${passthrough[@]}"}; do
        case "${arg#[+~]}" in
            trainer.* | data.* | ray_kwargs.* | hydra.* | actor_rollout_ref.model.* | -*) ;;
            *) name_args+=("$arg") ;;
        esac
    done
    if ((${#name_args[@]})); then
        # sorted: the same overrides in another order are the same run
        suffix="-$(printf '%s\n' "${name_args[@]}" | LC_ALL=C sort | cksum | cut -d' ' -f1)"
    fi
    EXPERIMENT_NAME="${EXPERIMENT_NAME:-$1-${METHOD}${suffix}}"
}

# The user's overrides go last, so that they win over the script's (Hydra keeps the last value of a key).
recipe_launch() {
    local command=(
        "${PYTHON:-python}" -m recipe_apo.main
        method="$METHOD"  # conf/method/<method>.yaml: estimator, loss, aggregation (L0), clip or soft gate
        "$@"
        trainer.experiment_name="$EXPERIMENT_NAME"
        ${passthrough[@]+"${passthrough[@]}"}
    )
    case "${RECIPE_APO_DRY_RUN:-0}" in
        0 | "") exec "${command[@]}" ;;
        args) printf '%s\n' "${command[@]}" ;;
        *) exec "${command[@]}" --cfg job ;;
    esac
}
