"""Runs one zoo case and prints what the check said (for the before/after table; not a test)."""
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo
zoo.preload('transformers', 'open_clip', 'timm', 'open_clip.loss', 'timm.models.vision_transformer')
from gradcheck_dist.harness import GradcheckFailure, check_ddp, check_lightning

HARNESS = {
    "bert_cls": (zoo.make_bert_cls, zoo.step_bert_cls, zoo.bert_batch),
    "bert_mlm": (zoo.make_bert_mlm, zoo.step_bert_mlm, zoo.bert_batch),
    "bert_aux_sum": (zoo.make_bert_aux, zoo.step_bert_aux_sum, zoo.bert_batch),
    "bert_aux_even": (zoo.make_bert_aux, zoo.step_bert_aux_even, zoo.bert_batch),
    "bert_ignored": (zoo.make_bert_ignored, zoo.step_bert_ignored, zoo.bert_batch),
    "gpt2": (zoo.make_gpt2, zoo.step_gpt2, zoo.bert_batch),
    "vit": (zoo.make_vit, zoo.step_vit, zoo.image_batch),
    "vit_bf16": (zoo.make_vit, zoo.step_vit_bf16, zoo.image_batch),
    "vit_bf16_sum": (zoo.make_vit, zoo.step_vit_bf16_sum, zoo.image_batch),
    "bert_bf16": (zoo.make_bert_cls, zoo.step_bert_bf16, zoo.bert_batch),
    "clip_default": (zoo.make_clip, zoo.step_clip_default, zoo.clip_batch),
    "clip_grad": (zoo.make_clip, zoo.step_clip_grad, zoo.clip_batch),
    "clip_local_grad": (zoo.make_clip, zoo.step_clip_local_grad, zoo.clip_batch),
    "clip_local_nograd": (zoo.make_clip, zoo.step_clip_local_nograd, zoo.clip_batch),
    "siglip_bidir": (zoo.make_siglip, zoo.step_siglip_bidir, zoo.clip_batch),
    "siglip_shift": (zoo.make_siglip, zoo.step_siglip_shift, zoo.clip_batch),
    "siglip_reduce": (zoo.make_siglip, zoo.step_siglip_reduce, zoo.clip_batch),
    "siglip_gather": (zoo.make_siglip, zoo.step_siglip_gather, zoo.clip_batch),
    "mlp": (zoo.make_mlp, zoo.step_mlp, zoo.mlp_batch),
    "mlp_sum": (zoo.make_mlp, zoo.step_mlp_sum, zoo.mlp_batch),
}
LIGHTNING = {"lit_nosync": zoo.make_lit_nosync, "lit_sync": zoo.make_lit_sync}


def summary(rc, report, text):
    out = {"rc": rc}
    if report:
        ps = report["runs"][0]["params"]
        out["statuses"] = sorted({p["status"] for p in ps})
        out["not_ok"] = {p["name"]: [p["status"]] + ([round(p["scale"], 4)] if p.get("scale") is not None else [])
                         for p in ps if p["status"] != "ok"}
        out["findings"] = [f["message"] for f in report["runs"][0]["findings"]]
    else:
        out["text"] = text[-1500:]
    return out


def main(case):
    t = time.monotonic()
    try:
        if case in HARNESS:
            m, s, b = HARNESS[case]
            try:
                r = summary(0, check_ddp(m, s, b(), world=4, timeout=float(os.environ.get("ZOO_TIMEOUT", 300))), "")
            except GradcheckFailure as e:
                r = summary(1, e.report, str(e))
        elif case in LIGHTNING:
            try:
                r = summary(0, check_lightning(LIGHTNING[case], zoo.make_lit_batch, world=4), "")
            except GradcheckFailure as e:
                r = summary(1, e.report, str(e))
        else:
            r = summary(*getattr(zoo, "pattern_" + case) and zoo.run_pattern(getattr(zoo, "pattern_" + case)))
    except Exception as e:
        r = {"exception": type(e).__name__, "text": str(e)[-2500:]}
    r["seconds"] = round(time.monotonic() - t, 1)
    print(json.dumps({case: r}, indent=1))


main(sys.argv[1])
