"""`raypd generate --mode pd|mixed`: start the node actors, send every prompt through them at once,
and return CompletionOutputs like the single-engine LLM.generate."""
from __future__ import annotations

import asyncio

from cluster.local_cluster import ClusterSpec, NodeCluster
from cluster.request_driver import RequestDriver
from engine.llm import encode_prompt
from engine.model_source import resolve_model
from engine.outputs import CompletionOutput
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer


class GenerationError(RuntimeError):
    """A request ended with an error on the cluster."""


def spec_from_args(args) -> ClusterSpec:
    from cluster.generate_cmd import engine_options

    options = {k: v for k, v in engine_options(args).items() if k != "num_threads"}
    role_options = {"decode": {"num_blocks": args.decode_num_blocks}} if args.decode_num_blocks else {}
    if min(args.prefill_nodes, args.decode_nodes) < 1 if args.mode == "pd" else args.mixed_nodes < 1:
        raise ValueError("--mode pd needs >= 1 prefill and decode node; --mode mixed needs >= 1 mixed node")
    if args.mode == "pd":
        counts = dict(prefill_nodes=args.prefill_nodes, decode_nodes=args.decode_nodes)
    else:
        counts = dict(mixed_nodes=args.mixed_nodes)
    return ClusterSpec(model=args.model, engine_options=options, role_engine_options=role_options,
                       transfer_options={"backend": args.transfer_backend}, cpus_per_node=args.cpus_per_node,
                       gpus_per_node=args.gpus_per_node, place_by_role=args.place_by_role, **counts)


def generate_on_cluster(args, prompts: list, params: SamplingParams) -> list[CompletionOutput]:
    tokenizer = Tokenizer(resolve_model(args.model))
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    with NodeCluster.start(spec_from_args(args), address=args.address) as cluster, \
            RequestDriver(cluster.nodes, chunk_timeout_s=args.timeout) as driver:
        results = asyncio.run(_run_all(driver, encoded, params))
    outputs = []
    for i, (ids, (tokens, final)) in enumerate(zip(encoded, results)):
        if final.error:
            raise GenerationError(f"prompt {i}: {final.error}")
        outputs.append(CompletionOutput(f"req-{i}", ids, tokens, tokenizer.decode(tokens), final.finish_reason,
                                        final.num_cached_tokens))
    return outputs


async def _run_all(driver: RequestDriver, encoded: list[list[int]], params: SamplingParams):
    async def one(i: int, ids: list[int]):
        tokens: list[int] = []
        async for chunk in driver.generate(f"req-{i}", ids, params):
            tokens.extend(chunk.token_ids)
            if chunk.finished:
                return tokens, chunk
        raise GenerationError(f"prompt {i}: the stream ended without a final message")
    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(encoded)))
