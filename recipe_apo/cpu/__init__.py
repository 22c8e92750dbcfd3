"""The CPU rehearsal: verl's whole training loop, on a CPU, with a tiny model, before GPUs are rented.

Selected with ``rehearsal=cpu`` (``python -m recipe_apo.main method=apo rehearsal=cpu ...``); nothing here is
imported otherwise. Its parts:

- ``platform``: a CPU platform for verl (device ``cpu``, backend ``gloo``);
- ``hf_server``, ``hf_rollout``: the ``hf`` rollout backend, Hugging Face ``generate`` behind verl's server
  interface, in place of vLLM;
- ``vllm_engine``: what verl's own vLLM rollout needs on vLLM's CPU build (``rollout.name=vllm``);
- ``local_cluster``: several Ray nodes on this machine, for ``trainer.nnodes>1``;
- ``patches``: the few places where verl 0.9.1 cannot run on a CPU as shipped;
- ``activate``: turns all of that on in a process (imported by verl itself in every Ray worker);
- ``checks``: what the rehearsal cannot do, refused before Ray starts;
- ``make_tiny``, ``reward``: a tiny Qwen2 model, tokenizer and two-source toy dataset made locally, and its reward;
- ``rehearse``: ``make rehearse``, the four methods through the whole loop, with a checkpoint and a resume.
"""
