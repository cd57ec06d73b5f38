//! The command line as clap reads it: defaults, environment variables,
//! conflicts, and the values of flags.

use super::*;

#[test]
fn id_secret_files_hold_32_hex_digits() {
    let dir = std::env::temp_dir().join(format!("mcp-id-guard-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("secret");
    std::fs::write(&file, "000102030405060708090a0b0c0d0e0F\n").unwrap();
    assert_eq!(
        read_id_secret(&file).unwrap(),
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    for bad in [
        "",
        "0011",
        "zz0102030405060708090a0b0c0d0e0f",
        "000102030405060708090a0b0c0d0e0f00",
    ] {
        std::fs::write(&file, bad).unwrap();
        assert!(read_id_secret(&file).is_err(), "{bad:?}");
    }
    assert!(read_id_secret(&dir.join("missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn durations() {
    assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("").is_err());
    assert!(parse_duration("fast").is_err());
    assert!(parse_duration("5h").is_err());
}

#[test]
fn arguments() {
    use clap::CommandFactory;
    Args::command().debug_assert();
    let args = Args::try_parse_from([
        "mcp-id-guard",
        "--upstream",
        "http://127.0.0.1:8000/mcp",
        "--on-duplicate",
        "reject",
        "--reject-status",
        "409",
    ])
    .unwrap();
    assert_eq!(args.on_duplicate, Policy::Reject);
    assert_eq!(args.reject_status, http::StatusCode::CONFLICT);
    assert_eq!(args.abandoned_id_ttl, Duration::from_secs(300));
    assert_eq!(args.restart_window, None, "as long as the abandoned-id TTL");
    assert_eq!(args.max_session_id_bytes, 8 * 1024);
    assert_eq!(args.max_table_bytes, 64 * 1024 * 1024);
    assert!(!args.rewrite_all_ids);
    assert_eq!(args.max_requests_per_connection, 1000);
    assert_eq!(args.max_client_resets, 250);
    assert_eq!(args.client_reset_window, Duration::from_secs(60));
    assert_eq!(args.admin_max_connections, 16);
    assert_eq!(args.admin_send_timeout, Duration::from_secs(2));
    assert_eq!(args.admin_header_read_timeout, Duration::from_secs(2));
    assert!(!args.trust_forwarded);
    assert_eq!(args.max_body_memory_bytes, 64 * 1024 * 1024);
    assert_eq!(args.max_body_memory_per_connection, None);
    assert_eq!(args.max_body_memory_per_client, None, "half the budget");
    let args = Args::try_parse_from([
        "mcp-id-guard",
        "--upstream",
        "http://h",
        "--on-duplicate",
        "queue",
        "--max-queue-wait",
        "2s",
        "--rewrite-all-ids",
        "--reject-status",
        "422",
        "--abandoned-id-ttl",
        "0",
        "--restart-window",
        "1m",
        "--max-table-bytes",
        "1048576",
    ])
    .unwrap();
    assert_eq!(args.restart_window, Some(Duration::from_secs(60)));
    assert_eq!(args.max_table_bytes, 1 << 20);
    assert_eq!(args.reject_status.as_u16(), 422);
    assert_eq!(args.abandoned_id_ttl, Duration::ZERO);
    assert_eq!(args.on_duplicate, Policy::Queue);
    assert_eq!(args.max_queue_wait, Duration::from_secs(2));
    assert!(args.rewrite_all_ids);
    assert!(Args::try_parse_from([
        "mcp-id-guard",
        "--upstream",
        "http://h",
        "--reject-status",
        "500"
    ])
    .is_err());
    // The upstream command after `--`, with --upstream-port.
    let args = Args::try_parse_from([
        "mcp-id-guard",
        "--upstream-port",
        "3000",
        "--",
        "node",
        "server.js",
        "--port",
        "3000",
    ])
    .unwrap();
    assert_eq!(args.upstream, None);
    assert_eq!(args.upstream_port, Some(3000));
    assert_eq!(args.upstream_url(), "http://127.0.0.1:3000");
    assert_eq!(args.command, ["node", "server.js", "--port", "3000"]);
    assert_eq!(args.upstream_start_timeout, Duration::from_secs(30));
    let args = Args::try_parse_from(["mcp-id-guard", "--upstream-port", "3000"]).unwrap();
    assert!(args.command.is_empty(), "a server already running there");
    for bad in [
        &["mcp-id-guard"][..],
        &["mcp-id-guard", "--", "node", "server.js"],
        &["mcp-id-guard", "--upstream", "http://h", "--", "node"],
        &[
            "mcp-id-guard",
            "--upstream",
            "http://h",
            "--upstream-port",
            "1",
        ],
        &["mcp-id-guard", "--upstream-port", "0"],
    ] {
        assert!(Args::try_parse_from(bad).is_err(), "{bad:?} accepted");
    }
    for bad in ["200", "99", "600", "4xx", ""] {
        assert!(parse_reject_status(bad).is_err(), "{bad:?} accepted");
    }
}
