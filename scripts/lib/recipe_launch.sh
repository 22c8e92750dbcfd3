# Sourced by scripts/train_*.sh, which differ only in their overrides: the method switch, the run name, what is
# recorded and the dry run behave the same in every run. Call in order:
#
#   recipe_parse_method "$@"            # METHOD (method=<m> anywhere on the line, else $METHOD, else apo);
#                                       # Hydra's flags in `hydra_flags`, the overrides in `passthrough`
#   recipe_validation <samples|greedy>  # validation's sampling, VAL_N etc. over the script's default: VALIDATION
#   recipe_launch <prefix> <the script's overrides...>
#                                       # runs (or prints) recipe_apo.main with METHOD, the script's overrides,
#                                       # RECORDING and then the user's
#
# Arrays are expanded as ${a[@]+"${a[@]}"}: under `set -u`, bash before 4.4 (macOS ships 3.2) takes an empty
# "${a[@]}" for an unset variable.

recipe_parse_method() {
    METHOD="${METHOD:-apo}"
    passthrough=()
    hydra_flags=()
    local arg takes_value=0
    for arg in "$@"; do
        # 1: the flag's value follows; 2: a value may follow (--info [what]), unless it is an override.
        if ((takes_value == 1)) || { ((takes_value == 2)) && [[ "$arg" != *=* && "$arg" != -* ]]; }; then
            hydra_flags+=("$arg")
            takes_value=0
            continue
        fi
        takes_value=0
        case "$arg" in
            method=*) METHOD="${arg#method=}" ;;
            # Hydra's flags (-m, --cfg job, ...) go before every override: its parser takes no flag between them.
            -c | --cfg | -p | --package | -cp | --config-path | -cn | --config-name | -cd | --config-dir | \
                --experimental-rerun) hydra_flags+=("$arg"); takes_value=1 ;;
            -i | --info) hydra_flags+=("$arg"); takes_value=2 ;;
            -*) hydra_flags+=("$arg") ;;
            *) passthrough+=("$arg") ;;
        esac
    done
    recipe_check_method
}

# The method presets: the files of conf/method/ (what recipe_apo/integration/presets.py lists, here
# in file-name order), found from this file's place in the checkout.
RECIPE_METHOD_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../conf/method" 2>/dev/null && pwd)"

recipe_methods() {
    local file
    for file in "$RECIPE_METHOD_DIR"/*.yaml; do
        if [[ -f "$file" ]]; then basename "$file" .yaml; fi
    done
}

# METHOD must name a preset file; otherwise exit 2, naming the presets.
recipe_check_method() {
    if [[ -z "$METHOD" || "$METHOD" == */* || ! -f "$RECIPE_METHOD_DIR/$METHOD.yaml" ]]; then
        local known="" name
        while IFS= read -r name; do known+="${known:+, }$name"; done < <(recipe_methods)
        echo "error: method must be one of the presets in conf/method/ ($known), got '$METHOD'" >&2
        exit 2
    fi
}

# How validation samples (verl's actor_rollout_ref.rollout.val_kwargs), from the environment: VAL_N samples per
# problem (default: the script's, the first argument) or `greedy` (one answer at temperature 0, Dr. GRPO's
# evaluation), VAL_TEMPERATURE and VAL_TOP_P (default 1.0 each: the policy's own distribution, as in training).
# verl then logs val-core/<benchmark>/acc/mean@<VAL_N> (mean pass@1) and best@<VAL_N>/mean (pass@k). The
# overrides go in VALIDATION; a bad value exits 2 naming its variable.
recipe_validation() {
    local n="${VAL_N:-$1}" temperature="${VAL_TEMPERATURE:-1.0}" top_p="${VAL_TOP_P:-1.0}"
    if [[ "$n" == greedy ]]; then
        if [[ -n "${VAL_TEMPERATURE:-}${VAL_TOP_P:-}" ]]; then
            echo "error: VAL_TEMPERATURE and VAL_TOP_P are for sampled validation; VAL_N=greedy decodes at" \
                "temperature 0" >&2
            exit 2
        fi
        VALIDATION=(
            actor_rollout_ref.rollout.val_kwargs.n=1
            actor_rollout_ref.rollout.val_kwargs.do_sample=false
            actor_rollout_ref.rollout.val_kwargs.temperature=0
            actor_rollout_ref.rollout.val_kwargs.top_p=1.0
        )
        return
    fi
    if [[ ! "$n" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: VAL_N must be a number of samples per problem (1 or more) or 'greedy', got '$n'" >&2
        exit 2
    fi
    # Plain decimal numbers ("0.6", "1", "1e-1"; not "hot" or "0.6x"), compared by awk: bash has no decimals.
    local number='^[0-9]*[.]?[0-9]+([eE][-+]?[0-9]+)?$'
    if [[ ! "$temperature" =~ $number ]] || ! awk -v t="$temperature" 'BEGIN { exit !(t + 0 > 0) }'; then
        echo "error: VAL_TEMPERATURE must be a number above 0 (VAL_N=greedy for greedy decoding), got" \
            "'$temperature'" >&2
        exit 2
    fi
    if [[ ! "$top_p" =~ $number ]] || ! awk -v p="$top_p" 'BEGIN { exit !(p + 0 > 0 && p + 0 <= 1) }'; then
        echo "error: VAL_TOP_P must be a number in (0, 1], got '$top_p'" >&2
        exit 2
    fi
    VALIDATION=(
        actor_rollout_ref.rollout.val_kwargs.n="$n"
        actor_rollout_ref.rollout.val_kwargs.do_sample=true
        actor_rollout_ref.rollout.val_kwargs.temperature="$temperature"
        actor_rollout_ref.rollout.val_kwargs.top_p="$top_p"
    )
}

# What every paper run records, under its own checkpoint folder (checkpoints/<project>/<experiment>/): every
# step's rollouts (one JSONL per step: what the bias audit reads) and every validation's generations (the
# final one is the paper's table), plus the loggers named in LOGGERS (verl's trainer.logger; default
# console,file: a JSONL of metrics per run under ./<project>/).
recipe_recording() {
    RECORDING=(
        'trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts'
        'trainer.validation_data_dir=${trainer.default_local_dir}/validation'
        "trainer.logger=[${LOGGERS:-console,file}]"
    )
}

# An override's key: what is left of `[+~]key[=value]` once the value and Hydra's + and ~ are cut off.
recipe_override_key() {
    local key="${1%%=*}"
    printf '%s' "${key#"${key%%[!+~]*}"}"
}

# The run's name is made by recipe_apo.main (recipe_apo/integration/naming.py), from the prefix, the method and every
# override that changes what is trained: the script's own (the first run_name.script_overrides, which count
# through a hash) and the user's (spelled out). So a rerun resumes its own run (verl's resume_mode=auto) and a
# changed setting, model or dataset never resumes another run's checkpoints. EXPERIMENT_NAME sets it instead.
#
# A user's override of one of the script's keys replaces the script's (no key is passed twice: in a multirun
# Hydra would merge the two into the script's place, hiding the user's change); one equal to the script's
# setting is dropped, so saying a default changes nothing. The user's overrides go last.
recipe_launch() {
    local prefix="$1"
    shift
    recipe_recording
    local arg own user_keys=" " user=() settings=()
    for arg in ${passthrough[@]+"${passthrough[@]}"}; do
        for own in "$@" "${RECORDING[@]}"; do
            [[ "$arg" == "$own" ]] && continue 2
        done
        user+=("$arg")
        user_keys+="$(recipe_override_key "$arg") "
    done
    for arg in method="$METHOD" "$@" "${RECORDING[@]}"; do
        [[ "$user_keys" == *" $(recipe_override_key "$arg") "* ]] || settings+=("$arg")
    done
    local command=(
        "${PYTHON:-python}" -m recipe_apo.main
        ${hydra_flags[@]+"${hydra_flags[@]}"}
        "${settings[@]}"  # method first: conf/method/<method>.yaml (estimator, loss, aggregation, clip or gate)
        run_name.prefix="$prefix"
        run_name.script_overrides="${#settings[@]}"
    )
    if [[ -n "${EXPERIMENT_NAME:-}" ]]; then
        command+=(trainer.experiment_name="$EXPERIMENT_NAME")
    fi
    command+=(${user[@]+"${user[@]}"})
    case "${RECIPE_APO_DRY_RUN:-0}" in
        0 | "" | false | no) exec "${command[@]}" ;;
        args) printf '%s\n' "${command[@]}" ;;
        cfg) exec "${command[@]}" --cfg job ;;
        *) exec "${command[@]}" dry_run=true ;;
    esac
}
