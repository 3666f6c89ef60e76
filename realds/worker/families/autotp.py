# Family `autotp`: DeepSpeed's AutoTP training (`"tensor_parallel": {"autotp_size":
# tp}`, DeepSpeed 0.16.4 and later) of a transformers `LlamaForCausalLM` built from
# a tiny `LlamaConfig` (random init from the case's seed; sid root: transformers
# 5.12). deepspeed.initialize itself cuts the model over tp (the job's config gets
# `tensor_parallel` from ds_config below at tp > 1; at tp 1 the model stays whole,
# as a user who trains without AutoTP). Every tp rank trains the same samples
# (AutoTP checks that its tp group's inputs agree); the dp rank is rank // tp
# (DeepSpeed's tp groups are runs of consecutive ranks: checked after initialize).
#
# How AutoTP cuts (DeepSpeed master module_inject/tp_shard.py get_shard_size,
# tp_grain_size 1 for training): q/k/v by rows in whole key-value heads, gate/up by
# rows, o/down by columns, lm_head by vocabulary rows; tp rank r of a dimension of
# size n holds n // tp + (1 if r < n % tp else 0) rows/columns (the first n % tp
# ranks one more); embeddings and norms replicated. The oracle concatenates the
# slices along SPLITS' dim, whatever their widths.
import torch
import torch.distributed as dist
import torch.nn.functional as F

from families import Built, common_args

SPLITS = [
    (r"\.(q|k|v|gate|up)_proj\.weight$", 0),
    (r"\.down_proj\.weight$", 1),
    # o_proj: by columns in the Llama, whole in the Phi-3 (whose attention is not cut, below).
    (r"\.o_proj\.weight$", (1, None)),
    # Phi-3's fused gate_up_proj: each tp rank holds a piece of the gate and one of
    # the up projection, side by side, in AutoTP's widths (layers.py SubParamLinearLayer).
    (r"\.gate_up_proj\.weight$", ("sub", 0, 2)),
    (r"\.qkv_proj\.weight$", None),
    # lm_head by vocabulary rows; DeepSpeed 0.19.5 cuts one whose vocabulary tp
    # does not divide by columns (auto_tp.py _create_column_parallel_layer falls
    # back to LmHeadLinearAllreduce), master by rows in uneven widths.
    (r"^lm_head\.weight$", (0, 1, None)),  # None: whole (the Phi-3 partition_config leaves it)
    (r".", None),  # embed_tokens, the RMSNorms, rotary buffers
]


def add_args(ap):
    common_args(ap)
    ap.add_argument("--inter", type=int, default=64, help="intermediate (MLP) size")
    ap.add_argument("--kv_heads", type=int, default=0, help="key-value heads (default: --heads)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--zero_init", action="store_true",
                    help="build the model under deepspeed.zero.Init over the dp group (ZeRO-3): AutoTP then cuts "
                         "params ZeRO-3 has already partitioned (their shape from ds_shape: master #8270)")
    ap.add_argument("--arch", default="llama", choices=("llama", "phi3"),
                    help="phi3: a Phi3ForCausalLM whose fused MLP gate_up_proj AutoTP cuts per sub-param "
                         "(tensor_parallel.partition_config, below)")


def ds_config(cfg, topo):
    """Merged into the job's DeepSpeed config."""
    if topo["tp"] > 1:
        tp = {"autotp_size": topo["tp"]}
        if cfg.arch == "phi3":
            # The MLP only: gate_up_proj as 2 sub-params of a -1 dim (DeepSpeed's
            # own example and its phi3 preset), down_proj by columns. The attention
            # stays whole: transformers 5.12's Phi-3 slices its fused qkv by the
            # config's head counts, which a tp cut of qkv_proj breaks (the phi3
            # preset fails in forward: mat1 and mat2 shapes cannot be multiplied).
            tp["partition_config"] = {"use_default_specs": False, "layer_specs": [
                {"patterns": [r".*\.mlp\.gate_up_proj\.weight$"], "partition_type": "column", "shape": [2, -1],
                 "partition_dim": 0},
                {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "row"}]}
        return {"tensor_parallel": tp}
    return {}


def llama(cfg):
    import transformers
    if cfg.arch == "phi3":
        import transformers.models.phi3.modeling_phi3  # noqa: F401 (lazy modules)
        conf = transformers.Phi3Config(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.inter,
                                       num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                                       num_key_value_heads=cfg.kv_heads or cfg.heads, max_position_embeddings=64,
                                       original_max_position_embeddings=64, tie_word_embeddings=False,
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(cfg.seed)
        return transformers.Phi3ForCausalLM(conf)
    import transformers.models.llama.modeling_llama  # noqa: F401 (lazy modules)
    conf = transformers.LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.inter,
                                    num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                                    num_key_value_heads=cfg.kv_heads or cfg.heads, max_position_embeddings=64,
                                    tie_word_embeddings=False)
    torch.manual_seed(cfg.seed)
    return transformers.LlamaForCausalLM(conf)


def build(cfg, topo):
    if topo["pp"] != 1:
        raise SystemExit("family autotp: pp must be 1")
    tp = topo["tp"]
    rank = dist.get_rank()
    tp_rank, dp_rank = rank % tp, rank // tp
    mpu = None
    if tp > 1:
        # DeepSpeed's own tp/dp groups (what initialize makes for AutoTP), given as
        # the mpu so that its batch arithmetic counts dp ranks, not all ranks (as
        # merge_tp_model_init_into_config does for tp_model_init without a group).
        from deepspeed.utils import groups
        groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
        mpu = groups
    if cfg.zero_init:
        import deepspeed
        from deepspeed.utils import groups
        dp_group = groups.get_data_parallel_group() if tp > 1 else None
        # (fp32 from a config: Init's dtype=torch.float32 is lost on a CPU without fp16,
        # `dtype or torch.float16 if ... else torch.bfloat16 if ...` giving bf16.)
        conf = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
        with deepspeed.zero.Init(data_parallel_group=dp_group, config_dict_or_path=conf):
            model = llama(cfg)
    else:
        model = llama(cfg)

    # AutoTP's update_mp_params divides the head counts and sizes of every module
    # it does not replace (Phi3Attention.num_key_value_heads, ...), also where
    # partition_config leaves the attention whole: the Phi-3 model gets them back
    # after initialize, as a user whose attention is not cut must do.
    kept = {}
    if tp > 1 and cfg.arch == "phi3":
        kept = {n: {a: getattr(m, a) for a in ("num_key_value_heads", "num_heads", "num_attention_heads",
                                                "hidden_size", "head_dim") if isinstance(getattr(m, a, None), int)}
                for n, m in model.named_modules()}

    def loss(engine, x, y):
        if kept:
            for n, m in engine.module.named_modules():
                for a, v in kept.get(n, {}).items():
                    setattr(m, a, v)
        if tp > 1:
            from deepspeed.utils import groups
            got = (groups.get_tensor_model_parallel_rank(), groups.get_data_parallel_rank())
            if got != (tp_rank, dp_rank):
                raise SystemExit(f"family autotp: rank {rank} is tp {got[0]} dp {got[1]} in DeepSpeed, "
                                 f"the family assumed tp {tp_rank} dp {dp_rank}")
        logits = engine(input_ids=x).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    # param_groups None: DeepSpeed takes the module's params after AutoTP replaced its layers.
    built = Built(module=model, param_groups=None, pipeline=False, mpu=mpu, loss=loss, tp_rank=tp_rank, dp_rank=dp_rank,
                  records_losses=tp_rank == 0)
    built.split_of_param = split_of_param
    return built


def split_of_param(p):
    """The split AutoTP marked on a param (its universal-checkpoint metadata)."""
    meta = getattr(p, "ds_autotp_universal_checkpoint_meta", None)
    if not meta or meta.get("replicated"):
        return None
    return meta.get("partition_dim")


def client_state(cfg, topo, iteration):
    return {"iteration": iteration}
