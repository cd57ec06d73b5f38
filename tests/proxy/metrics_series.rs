//! The binary's `/metrics` keeps its families and series when the metrics
//! move to `prometheus-client` (issue #31): the `# TYPE` lines and every
//! sample's name and labels after a fixed traffic are compared with
//! `metrics_series.txt`, taken from the hand-written encoder before the
//! move, so a dashboard's queries still find what they query. The same
//! scrape holds every line of README.md's `/metrics` sample.

use std::collections::BTreeSet;

use crate::hardening::{admin_base, get};
use crate::support::client::Session;
use crate::support::process::Guard;
use crate::support::proxy::{duplicate_while_held, Outcome};
use crate::support::server::upstream;

/// Every `# TYPE` line, and each sample's name with its labels (values
/// dropped: they depend on timing); sorted.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with("# HELP") && !line.starts_with("# EOF"))
        .map(|line| match line.strip_prefix("# TYPE ") {
            Some(_) => line.to_owned(),
            None => normalized(line.rsplit_once(' ').map_or(line, |(key, _)| key)),
        })
        .collect()
}

/// A sample's name and labels with the labels sorted: a label set has no
/// order (prometheus-client writes a histogram's `le` first).
fn normalized(key: &str) -> String {
    let Some((name, labels)) = key.split_once('{') else {
        return key.to_owned();
    };
    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
    labels.sort_unstable();
    format!("{name}{{{}}}", labels.join(","))
}

/// Families that are written only once something is recorded in them, or
/// (prometheus-client) always: a dashboard sees no series either way.
fn without_empty_families(series: BTreeSet<String>) -> BTreeSet<String> {
    let sampled: BTreeSet<&str> = series
        .iter()
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split(['{', ' ']).next().unwrap_or(line))
        .collect();
    series
        .iter()
        .filter(|line| match line.strip_prefix("# TYPE ") {
            Some(rest) => {
                let family = rest.split(' ').next().unwrap_or(rest);
                sampled.iter().any(|sample| sample.starts_with(family))
            }
            None => true,
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_binarys_metrics_keep_their_families_and_series() -> anyhow::Result<()> {
    let rmcp = upstream().await?;
    let guard = Guard::start(&[
        "--upstream",
        &rmcp.base,
        "--admin-listen",
        "127.0.0.1:0",
        "--metrics-tool-names",
        "1",
    ])
    .await?;
    let admin = admin_base(&guard).await?;
    let session = Session::open(&guard.url()).await?;
    assert_eq!(duplicate_while_held(&rmcp, &session).await?, Outcome::Own);
    let (status, text) = get(&format!("{admin}/metrics")).await?;
    assert_eq!(status, 200);
    assert!(text.ends_with("# EOF\n"), "{text}");
    let now = without_empty_families(series(&text));
    if std::env::var_os("MCP_ID_GUARD_WRITE_SERIES").is_some() {
        let mut golden = now.iter().cloned().collect::<Vec<_>>().join("\n");
        golden.push('\n');
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/proxy/metrics_series.txt"
            ),
            golden,
        )?;
    }
    // README.md's sample of this scrape ("### Metrics"): every line of it,
    // values included, is in the scrape.
    let readme = include_str!("../../README.md");
    let sample = readme
        .split("```text\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(block, _)| block))
        .find(|block| block.starts_with("mcp_id_guard_requests_total{"))
        .expect("README.md's /metrics sample");
    for line in sample.lines() {
        assert!(
            text.lines().any(|scraped| scraped == line),
            "README.md's /metrics sample line {line:?} is not in the scrape:\n{text}"
        );
    }
    let before: BTreeSet<String> = include_str!("metrics_series.txt")
        .lines()
        .map(normalized)
        .collect();
    let missing: Vec<_> = before.difference(&now).collect();
    let added: Vec<_> = now.difference(&before).collect();
    assert!(
        missing.is_empty() && added.is_empty(),
        "missing: {missing:#?}\nadded: {added:#?}\nscrape:\n{text}"
    );
    Ok(())
}
