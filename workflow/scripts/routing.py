"""Stage 'routing': per-token top-k expert ids from llama.cpp's graph -> npz, per-layer table, figure."""

from pathlib import Path

from moeplace.measure.routing import TraceRequest, routing_table, save_trace, trace_routing
from moeplace.report.figures.routing import routing_figure
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import stage, write_csv

with stage(snakemake.log[0]) as log:
    i, o, p, w = snakemake.input, snakemake.output, snakemake.params, snakemake.wildcards
    request = TraceRequest(Path(i.prompt).read_text(), p.gen)
    trace = trace_routing(
        Build.read(i.llamacpp), i.model[0], request, snakemake.threads, Path(snakemake.log[0]), p.timeout_s
    )
    table = routing_table(trace).assign(model=w.model)
    log.info("routed %d tokens through %d layers", trace.ids.shape[0], len(trace.layers))
    title = f"Expert routing of {w.model}"
    if p.twin:
        title += " (random-weight twin: not the trained model's routing)"
    save_trace(trace, o.trace)
    write_csv(o.table, table)
    routing_figure(trace, table, o.figure, title)
