//! The session table's unit tests: admission, release, cancellation, the
//! queue, abandoned ids, the byte budget and the restart window.

use super::*;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The settings of most tests: no restart window (their sessions never
/// start through the table).
fn config(on_duplicate: OnDuplicate) -> Config {
    Config {
        on_duplicate,
        max_in_flight_per_session: 8,
        restart_window: Duration::ZERO,
        ..Config::default()
    }
}

fn admit(table: &Arc<Table>, ids: &[&str], policy: OnDuplicate) -> Decision {
    table.admit(b"session-a", ids, ids.len() > 1, &config(policy))
}

/// A lone request with id 1 that queues (policy `Queue`).
fn queued(table: &Arc<Table>) -> (Registration, Arc<Waiter>) {
    let Decision::Queued {
        registration,
        ticket,
    } = admit(table, &["1"], OnDuplicate::Queue)
    else {
        panic!("queued expected")
    };
    (registration, ticket)
}

/// The server-side id of an admitted POST's first request, if remapped.
fn remapped_id(decision: &Decision) -> Option<Arc<[u8]>> {
    match decision {
        Decision::Admitted { routes, .. } => match &routes[0] {
            Route::Remapped { server_id, .. } => Some(Arc::clone(server_id)),
            Route::AsIs => None,
        },
        _ => panic!("admitted expected"),
    }
}

fn assert_drained(table: &Table) {
    let stats = table.stats();
    assert_eq!((stats.in_flight_requests, stats.in_flight_sessions), (0, 0));
}

/// Ends a registration as a finished exchange (dropping it abandons it).
fn end(admission: Decision) {
    match admission {
        Decision::Admitted { registration, .. } | Decision::Queued { registration, .. } => {
            registration.complete()
        }
        Decision::Duplicate { .. }
        | Decision::OverCapacity
        | Decision::OverBudget
        | Decision::SessionIdTooLong => {}
    }
}

#[test]
fn remap_then_release_frees_everything() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Remap);
    let second = admit(&table, &["\"1\""], OnDuplicate::Remap);
    let Decision::Admitted { routes, .. } = &second else {
        panic!("admitted expected")
    };
    assert!(
        matches!(
            routes[0],
            Route::Remapped {
                duplicate: true,
                ..
            }
        ),
        "the string \"1\" collides with 1"
    );
    assert_eq!(table.stats().in_flight_requests, 2);
    assert_eq!(table.stats().in_flight_sessions, 1);
    end(first);
    let third = admit(&table, &["1"], OnDuplicate::Remap);
    let Decision::Admitted { routes, .. } = &third else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "the unchanged slot is free again");
    end(second);
    end(third);
    assert_drained(&table);
}

#[test]
fn under_reject_a_request_remapped_past_a_shadow_still_holds_its_id() {
    let table = Arc::new(Table::new());
    drop(admit(&table, &["1"], OnDuplicate::Reject)); // abandoned: shadows 1
    let second = admit(&table, &["1"], OnDuplicate::Reject);
    assert!(matches!(
        &second,
        Decision::Admitted { routes, .. } if matches!(routes[0], Route::Remapped { duplicate: false, .. })
    ));
    assert!(
        matches!(
            admit(&table, &["1"], OnDuplicate::Reject),
            Decision::Duplicate { .. }
        ),
        "the client already has a request 1 in flight"
    );
    assert!(
        matches!(
            admit(&table, &["1"], OnDuplicate::Queue),
            Decision::Queued { .. }
        ),
        "and under Queue it waits for it"
    );
    end(second);
}

#[test]
fn reject_registers_nothing_and_flags_batch_members() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1"], OnDuplicate::Reject);
    let Decision::Duplicate { colliding } = admit(&table, &["2", "1", "2"], OnDuplicate::Reject)
    else {
        panic!("duplicate expected")
    };
    assert_eq!(colliding, [false, true, true]);
    assert_eq!(table.stats().in_flight_requests, 1);
}

#[test]
fn reserved_ids_are_always_rewritten() {
    let table = Arc::new(Table::new());
    let Decision::Admitted { routes, .. } =
        admit(&table, &["\"mcp-id-guard:forged\""], OnDuplicate::Reject)
    else {
        panic!("admitted expected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
}

#[test]
fn capacity_counts_requests() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1", "2", "3", "4", "5", "6"], OnDuplicate::Remap);
    assert!(matches!(
        admit(&table, &["7", "8", "9"], OnDuplicate::Remap),
        Decision::OverCapacity
    ));
    assert!(matches!(
        admit(&table, &["7", "8"], OnDuplicate::Remap),
        Decision::Admitted { .. }
    ));
    assert!(matches!(
        table.admit(b"session-b", &["1"], false, &config(OnDuplicate::Remap)),
        Decision::Admitted { .. }
    ));
}

#[test]
fn cancel_frees_the_oldest_and_names_its_server_id() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Remap);
    let second = admit(&table, &["1"], OnDuplicate::Remap);
    let server_id = &remapped_id(&second).expect("remapped expected");
    assert_eq!(
        table.cancel(b"session-b", "1"),
        None,
        "other sessions are untouched"
    );
    assert_eq!(
        table.cancel(b"session-a", "\"1\""),
        Some(Arc::from(&b"1"[..])),
        "the oldest, named as the server knows it"
    );
    assert_eq!(table.cancel(b"session-a", "1"), Some(Arc::clone(server_id)));
    assert_eq!(table.cancel(b"session-a", "1"), None);
    let reuse = admit(&table, &["1"], OnDuplicate::Reject);
    let Decision::Admitted { routes, .. } = &reuse else {
        panic!("freed at once")
    };
    assert!(
        matches!(
            routes[0],
            Route::Remapped {
                duplicate: false,
                ..
            }
        ),
        "the server may still answer the cancelled one"
    );
    assert_eq!(table.stats().cancelled_total, 2);
    // A server sends no response to a cancelled request: its stream ends
    // without one.
    drop(first);
    end(second);
    end(reuse);
    assert_eq!(
        table.stats().abandoned_ids,
        1,
        "the cancelled request the server knew as 1 may still be answered"
    );
    assert_drained(&table);
}

/// An abandoned request the server knows by the client's id and a live
/// remapped one share the id: the live one is cancelled (the client waits
/// for it), so the id is free again; the abandoned one is named only once no
/// live request has the id.
#[test]
fn cancel_names_a_live_remapped_request_before_an_abandoned_one() {
    let table = Arc::new(Table::new());
    drop(admit(&table, &["1"], OnDuplicate::Reject)); // abandoned as 1
    let live = admit(&table, &["1"], OnDuplicate::Reject);
    let server_id = &remapped_id(&live).expect("remapped past the abandoned id expected");
    assert_eq!(
        table.cancel(b"session-a", "1"),
        Some(Arc::clone(server_id)),
        "the live remapped request, not the abandoned one"
    );
    let reuse = admit(&table, &["1"], OnDuplicate::Reject);
    assert!(
        matches!(&reuse, Decision::Admitted { routes, .. } if matches!(routes[0], Route::Remapped { duplicate: false, .. })),
        "the cancelled request no longer holds the id: {reuse:?}"
    );
    end(reuse);
    assert_eq!(
        table.cancel(b"session-a", "1").as_deref(),
        Some(&b"1"[..]),
        "no live request left: the abandoned one, as the server knows it"
    );
    assert_eq!(table.cancel(b"session-a", "1"), None);
    end(live);
    assert_drained(&table);
}

#[test]
fn queue_hands_the_id_over_in_order() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let (second, second_ticket) = queued(&table);
    let (third, third_ticket) = queued(&table);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(second_ticket.poll_turn(&mut cx).is_pending());
    end(first);
    assert_eq!(second_ticket.poll_turn(&mut cx), Poll::Ready(None));
    assert!(third_ticket.poll_turn(&mut cx).is_pending());
    assert_eq!(table.stats().in_flight_requests, 2);
    second.complete();
    assert_eq!(third_ticket.poll_turn(&mut cx), Poll::Ready(None));
    third.complete();
    assert_drained(&table);
}

#[test]
fn a_queued_request_that_leaves_frees_its_place() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Queue);
    let (second, _) = queued(&table);
    let (third, ticket) = queued(&table);
    drop(second);
    end(first);
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(ticket.poll_turn(&mut cx), Poll::Ready(None));
    third.complete();
    assert_drained(&table);
}

#[test]
fn a_batch_with_a_duplicate_is_refused_under_queue() {
    let table = Arc::new(Table::new());
    let _held = admit(&table, &["1"], OnDuplicate::Queue);
    assert!(matches!(
        admit(&table, &["1", "2"], OnDuplicate::Queue),
        Decision::Duplicate { .. }
    ));
}

#[test]
fn an_abandoned_id_shadows_its_reuse_until_it_expires() {
    let table = Arc::new(Table::new());
    let first = admit(&table, &["1"], OnDuplicate::Reject);
    drop(first); // abandoned: never completed
    let stats = table.stats();
    assert_eq!(
        (
            stats.in_flight_requests,
            stats.in_flight_sessions,
            stats.abandoned_ids
        ),
        (0, 0, 1)
    );
    let Decision::Admitted {
        registration,
        routes,
    } = admit(&table, &["1"], OnDuplicate::Reject)
    else {
        panic!("reuse after abandoning is never rejected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
    registration.complete();

    let short = Config {
        abandoned_id_ttl: Duration::from_nanos(1),
        ..config(OnDuplicate::Reject)
    };
    let table = Arc::new(Table::new());
    let Decision::Admitted { registration, .. } = table.admit(b"s", &["1"], false, &short) else {
        panic!("admitted expected")
    };
    drop(registration);
    std::thread::sleep(Duration::from_millis(1));
    let Decision::Admitted {
        registration,
        routes,
    } = table.admit(b"s", &["1"], false, &short)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "expired");
    assert_eq!(table.stats().abandoned_ids, 0);
    registration.complete();
    assert_drained(&table);
}

#[test]
fn completed_exchanges_leave_nothing_behind() {
    let table = Arc::new(Table::new());
    let Decision::Admitted { registration, .. } = admit(&table, &["1", "2"], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    registration.complete();
    assert_eq!(table.stats().abandoned_ids, 0);
    let session_hash = table.hasher.hash_one(&b"session-a"[..]);
    assert!(table.shard(session_hash).sessions.is_empty());
}

#[test]
fn a_cancelled_request_shadows_its_id_even_after_its_stream_ended() {
    let short = Config {
        abandoned_id_ttl: Duration::from_millis(1),
        ..config(OnDuplicate::Reject)
    };
    let table = Arc::new(Table::new());
    let admit = |table: &Arc<Table>| table.admit(b"s", &["1"], false, &short);
    let first = admit(&table);
    assert!(table.cancel(b"s", "1").is_some());
    let Decision::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("reuse after a cancellation is never rejected")
    };
    assert!(matches!(
        routes[0],
        Route::Remapped {
            duplicate: false,
            ..
        }
    ));
    registration.complete();
    // The server closed the cancelled request's stream without a response,
    // but a handler that ignores cancellation may still answer it.
    drop(first);
    assert_eq!(table.stats().abandoned_ids, 1);
    let Decision::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("admitted expected")
    };
    assert!(
        matches!(routes[0], Route::Remapped { .. }),
        "still shadowed"
    );
    registration.complete();
    std::thread::sleep(Duration::from_millis(5));
    let Decision::Admitted {
        routes,
        registration,
    } = admit(&table)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "the shadow expired");
    registration.complete();
    assert_drained(&table);
    assert_eq!(table.stats().abandoned_ids, 0);
}

#[test]
fn a_cancellation_names_the_client_id_as_it_was_written() {
    let long = "\"a-request-id-longer-than-an-inline-key\"";
    let cases = [
        ("7", "\"7\""),
        ("\"abc\"", "\"abc\""),
        ("\"\\u0061\"", "\"a\""),
        ("-0", "0"),
        ("\"a\\\"b\"", "\"a\\\"b\""),
        (long, long),
        (
            "123456789012345678901234567890",
            "\"123456789012345678901234567890\"",
        ),
    ];
    for (written, cancelled_as) in cases {
        let table = Arc::new(Table::new());
        let held = admit(&table, &[written], OnDuplicate::Remap);
        assert!(matches!(&held, Decision::Admitted { routes, .. } if routes[0] == Route::AsIs));
        assert_eq!(
            table.cancel(b"session-a", cancelled_as).as_deref(),
            Some(written.as_bytes()),
            "{written} cancelled as {cancelled_as}"
        );
        end(held);
    }
}

#[test]
fn long_ids_collide_by_key_within_a_batch_and_across_posts() {
    let table = Arc::new(Table::new());
    let long = "\"a-request-id-longer-than-an-inline-key\"";
    let Decision::Admitted {
        registration,
        routes,
    } = admit(&table, &[long, "1", long], OnDuplicate::Remap)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs);
    assert_eq!(routes[1], Route::AsIs);
    assert!(matches!(
        routes[2],
        Route::Remapped {
            duplicate: true,
            ..
        }
    ));
    let Decision::Duplicate { colliding } = admit(&table, &["2", long], OnDuplicate::Reject) else {
        panic!("duplicate expected")
    };
    assert_eq!(colliding, [false, true]);
    registration.complete();
    assert_drained(&table);
    let Decision::Admitted {
        registration,
        routes,
    } = admit(&table, &[long], OnDuplicate::Reject)
    else {
        panic!("admitted expected")
    };
    assert_eq!(routes[0], Route::AsIs, "released");
    registration.complete();
    assert_drained(&table);
}

#[test]
fn stats_count_every_shard() {
    let table = Arc::new(Table::new());
    let sessions: Vec<String> = (0..500).map(|n| format!("session-{n}")).collect();
    let held: Vec<Decision> = sessions
        .iter()
        .map(|session| {
            table.admit(
                session.as_bytes(),
                &["1", "2"],
                true,
                &config(OnDuplicate::Remap),
            )
        })
        .collect();
    let stats = table.stats();
    assert_eq!(
        (stats.in_flight_requests, stats.in_flight_sessions),
        (1000, 500)
    );
    assert_eq!((stats.passed_total, stats.remapped_total), (1000, 0));
    let used = table
        .shards
        .iter()
        .filter(|shard| !shard.0.lock().unwrap().sessions.is_empty())
        .count();
    assert!(used > SHARDS / 2, "sessions spread over the shards: {used}");
    held.into_iter().for_each(end);
    assert_drained(&table);
    assert!(table
        .shards
        .iter()
        .all(|shard| shard.0.lock().unwrap().sessions.is_empty()));
}

#[test]
fn rewrite_all_ids_rewrites_unique_ids_too() {
    let table = Arc::new(Table::new());
    let config = Config {
        rewrite_all_ids: true,
        ..config(OnDuplicate::Remap)
    };
    let Decision::Admitted { routes, .. } = table.admit(b"s", &["1", "2"], true, &config) else {
        panic!("admitted expected")
    };
    assert!(routes.iter().all(|route| matches!(
        route,
        Route::Remapped {
            duplicate: false,
            ..
        }
    )));
}

/// Every way in and out of the table charges and refunds the same bytes:
/// once nothing is in flight, queued or abandoned, the table holds none.
mod limits;
