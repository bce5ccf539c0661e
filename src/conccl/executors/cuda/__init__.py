"""The copy-engine executor (:mod:`.executor`) and what it launches: a schedule compiled into
prebuilt driver calls (:mod:`.program`), a settled call's program as one CUDA graph
(:mod:`.graph_launch`), a settled TP pipeline captured whole (:mod:`.settled_pipeline`)."""
