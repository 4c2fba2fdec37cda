"""Measuring a trained model: TREC files and measures, the query sets and their relevance
(`queries`), the served system measured on val and test (`measure`, through
`qpr.retrieval.hybrid`), the baselines, the fusion and "no answer" choices made on
validation, and evaluation on any file (`on_file`, through `Bundle`)."""
