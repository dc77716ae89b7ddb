"""Stage 'publish': whatever results/ holds -> publish/<name>/ (tables, DATA.md, figures, index.html,
llama-bench.sqlite, MANIFEST.json) and publish/<name>.tar.gz."""

from pathlib import Path

from moeplace.report.publish import DICTIONARY, Contents, load_dictionary, publish, snakemake_report
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import read_json, read_jsonl, stage
from moeplace.runtime.provenance import pipeline_revision

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    records = [r for path in i.records for r in read_jsonl(path)]
    models = {Path(m).stem: read_json(m)["files"] for m in i.metadata}
    facts = {
        "name": Path(snakemake.output.folder).name,
        "pipeline": pipeline_revision(Path.cwd()),
        "llamacpp": Build.read(i.llamacpp).to_json() if "llamacpp" in i.keys() else None,
        "models": models,
        "hosts": sorted({f"{r.get('host')} ({r.get('cpu')})" for r in records}),
        "devices": sorted({str(r.get("device")) for r in records}),
        "not_run": p.missing,
        "not_from_this_config": p.stale,
        "config": p.config,
    }
    log_path = Path(snakemake.log[0])
    report = snakemake_report(log_path.with_suffix(".report.html"), list(i.figures), log_path, p.configfiles)
    contents = Contents(
        tables={str(Path(t).relative_to("results")): Path(t) for t in i.tables},
        figures={str(Path(f).relative_to("results")): Path(f) for f in i.figures},
        captions=p.captions,
        missing=p.missing,
        report=report,
    )
    folder = publish(Path(snakemake.output.folder), contents, records, load_dictionary(DICTIONARY), facts)
    log.info("published %d tables, %d figures, %d runs to %s (%d outputs not run)", len(i.tables), len(i.figures),
             len(records), folder, len(p.missing))  # fmt: skip
