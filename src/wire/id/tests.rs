use super::*;

/// `parse` as it was before its shortcut: every id decoded by serde_json
/// and every original read by it, the parts copied out.
fn parse_by_serde(raw: &str) -> Option<(u64, String, String)> {
    if !raw
        .strip_prefix('"')
        .is_some_and(|inside| inside.starts_with(RESERVED_PREFIX))
    {
        return None;
    }
    let decoded = serde_json::from_str::<Cow<'_, str>>(raw).ok()?;
    let rest = decoded.strip_prefix(RESERVED_PREFIX)?;
    let (tag, rest) = rest.split_once(':')?;
    let (serial, original) = rest.split_once(':')?;
    let well_formed = tag.len() == 16
        && tag.bytes().all(|byte| byte.is_ascii_hexdigit())
        && !serial.is_empty()
        && serial.bytes().all(|byte| byte.is_ascii_digit());
    if !well_formed || original.contains(['\r', '\n']) {
        return None;
    }
    let value = serde_json::from_str::<&RawValue>(original).ok()?;
    if value.get().len() != original.len() {
        return None;
    }
    let mac = u64::from_str_radix(tag, 16).ok()?;
    Some((mac, serial.to_owned(), original.to_owned()))
}

/// The shortcuts of `parse` (no decoding without escapes, no reading of
/// a plain integer original) give what reading everything with serde_json
/// gives, for minted ids of every kind of original and for near misses.
#[test]
fn parse_reads_as_serde_reads() {
    let minter = IdMinter::new();
    let originals = [
        "1",
        "0",
        "-0",
        "-7",
        "007",
        "1.5",
        "1e3",
        "123456789012345",
        "1234567890123456",
        r#""a""#,
        r#""\u0031""#,
        "[1,2]",
        "{}",
        "true",
        "null",
        "",
        " 1",
        "1 ",
        "1,2",
        "-",
        r#""a\"b""#,
        "[1,\r\n2]",
    ];
    let mut texts: Vec<String> = Vec::new();
    for original in originals {
        texts.push(String::from_utf8(minter.mint(original)).unwrap());
        for serial in ["1", "", "x", "12a"] {
            for tag in [
                "0123456789abcdef",
                "0123456789ABCDEF",
                "0123456789abcde",
                "g123456789abcdef",
            ] {
                texts.push(format!(r#""mcp-id-guard:{tag}:{serial}:{original}""#));
                let escaped = original.replace('\\', "\\\\").replace('"', "\\\"");
                texts.push(format!(r#""mcp-id-guard:{tag}:{serial}:{escaped}""#));
                texts.push(format!(r#""mcp-id-guard:{tag}:{serial}:\u0031{escaped}""#));
            }
        }
    }
    texts.extend(
        [
            r#""mcp-id-guard:""#,
            r#""mcp-id-guard""#,
            "\"mcp-id-guard:0123456789abcdef:1:1\\u0000\"",
            "\"mcp-id-guard:0123456789abcdef:1:1\u{1}\"",
        ]
        .map(String::from),
    );
    for text in &texts {
        let shortcut = parse(text).map(|parts| {
            (
                parts.mac,
                parts.serial.into_owned(),
                parts.original.into_owned(),
            )
        });
        assert_eq!(shortcut, parse_by_serde(text), "{text}");
    }
}

#[test]
fn equivalence() {
    assert_eq!(id_key("1"), id_key(r#""1""#));
    assert_eq!(id_key(r#""\u0031""#), id_key("1"));
    assert_eq!(id_key("-0"), id_key("0"));
    // Not JSON: the request path refuses it (no key).
    assert_eq!(key_of("-00"), None);
    assert_ne!(id_key("1"), id_key("2"));
    assert_eq!(id_key("1e3").as_bytes(), b"1000");
}

/// The plain-integer shortcut gives the key the general reading gives.
#[test]
fn plain_integers_take_the_shortcut_to_the_same_key() {
    let mut texts: Vec<String> = (0..2_000).map(|n: i64| n.to_string()).collect();
    texts.extend((1..2_000).map(|n: i64| (-n).to_string()));
    for digits in 14..=17 {
        let nines = "9".repeat(digits);
        texts.push(nines.clone());
        texts.push(format!("-{nines}"));
        texts.push(format!("1{}", "0".repeat(digits - 1)));
    }
    texts.extend(["-0", "00", "01", "-01", "0.0", "1e0", "-", ""].map(String::from));
    for text in &texts {
        assert_eq!(number_key(text), number_value_key(text), "{text:?}");
        if is_plain_integer(text.as_bytes()) {
            assert_eq!(key_of(text).as_deref(), Some(text.as_str()), "{text:?}");
        }
    }
}

/// String ids without escapes take the shortcut to the key serde_json
/// reads, and others (escapes, control characters, stray quotes, text
/// after the string) are read by serde_json.
#[test]
fn plain_strings_take_the_shortcut_to_the_same_key() {
    let parts = [
        "a", " ", "\"", "\\", "u", "0", "\u{0}", "\u{1f}", "\u{7f}", "é", "😀", "\\u00e9",
        "\\ud800",
    ];
    let mut insides = vec![String::new()];
    for _ in 0..3 {
        let longer: Vec<String> = insides
            .iter()
            .flat_map(|inside| parts.iter().map(move |part| format!("{inside}{part}")))
            .collect();
        insides.extend(longer);
    }
    for inside in &insides {
        for raw in [
            format!("\"{inside}\""),
            format!("\"{inside}\" "),
            format!("\"{inside}"),
        ] {
            let serde = serde_json::from_str::<String>(&raw).ok();
            assert_eq!(key_of(&raw).map(Cow::into_owned), serde, "{raw:?}");
        }
    }
}

#[test]
fn numbers_collide_by_value() {
    for same_as_one in ["1.0", "1e0", "10e-1", "0.1e1", "1E+0", "100e-2", r#""1""#] {
        assert_eq!(key_of(same_as_one).as_deref(), Some("1"), "{same_as_one}");
    }
    for zero in ["-0.0", "0e5", "-0", "0.000"] {
        assert_eq!(key_of(zero).as_deref(), Some("0"), "{zero}");
    }
    assert_eq!(key_of("-12.50").as_deref(), Some("-125e-1"));
    assert_eq!(key_of("1.5"), key_of("15e-1"));
    assert_eq!(key_of("1.5"), key_of("0.015e2"));
    assert_ne!(key_of("1.5"), key_of("1.50001"));
    assert_eq!(
        key_of("9007199254740991").as_deref(),
        Some("9007199254740991")
    );
    assert_eq!(
        key_of("-9007199254740991").as_deref(),
        Some("-9007199254740991")
    );
}

#[test]
fn ids_servers_read_differently_have_no_key() {
    for refused in [
        "9007199254740992",
        "-9007199254740993",
        "1e16",
        "123456789012345678901234567890",
        "1.0000000000000001",
        "1e-400",
        "1e9999999999",
        "01",
        "1.",
        ".5",
        "+1",
        "NaN",
        "Infinity",
        "true",
        "null",
        "[1]",
        "{}",
        r#""\ud800""#,
        "1 ",
    ] {
        assert_eq!(key_of(refused), None, "{refused}");
    }
}

#[test]
fn minted_ids_round_trip_byte_for_byte() {
    let minter = IdMinter::new();
    for original in [
        "1",
        r#""\u0031""#,
        r#""a\"b\\c""#,
        "-0",
        "1e3",
        "{\"a\":[1, 2]}",
        r#""ü""#,
    ] {
        let minted = String::from_utf8(minter.mint(original)).unwrap();
        let decoded: String = serde_json::from_str(&minted).expect("minted id is a JSON string");
        assert!(is_reserved(&decoded));
        assert_eq!(restore(&minted).as_deref(), Some(original), "{minted}");
    }
}

#[test]
fn minted_ids_are_unique_and_secrets_differ_per_instance() {
    let (a, b) = (IdMinter::new(), IdMinter::new());
    assert_ne!(a.mint("1"), a.mint("1"));
    assert_ne!(a.key, b.key);
    // Replicas sharing a secret count from different points.
    let secret = *b"0123456789abcdef";
    let (c, d) = (IdMinter::with_secret(secret), IdMinter::with_secret(secret));
    assert_ne!(c.mint_in(b"s", "1"), d.mint_in(b"s", "1"));
}

/// Only an id this secret issued for this session is restored; another
/// session's, another secret's, a forged one and a tampered one are
/// refused, and anything else is no server-side id at all.
#[test]
fn restoring_is_bound_to_the_secret_and_the_session() {
    let secret = *b"0123456789abcdef";
    let minter = IdMinter::with_secret(secret);
    let issued = String::from_utf8(minter.mint_in(b"session-y", "1").to_vec()).unwrap();
    let (y, x) = (
        minter.session_digest(b"session-y"),
        minter.session_digest(b"session-x"),
    );
    assert_eq!(
        minter.restore_in(y, &issued),
        Restored::Original("1".to_owned())
    );
    let replica = IdMinter::with_secret(secret);
    assert_eq!(
        replica.restore_in(replica.session_digest(b"session-y"), &issued),
        Restored::Original("1".to_owned()),
        "a replica with the same secret restores it"
    );
    assert_eq!(minter.restore_in(x, &issued), Restored::Foreign);
    let other = IdMinter::new();
    assert_eq!(
        other.restore_in(other.session_digest(b"session-y"), &issued),
        Restored::Foreign
    );
    let forged = r#""mcp-id-guard:0123456789abcdef:999999:42""#;
    assert_eq!(minter.restore_in(y, forged), Restored::Foreign);
    let tampered = issued.replacen(":1\"", ":2\"", 1);
    assert_ne!(tampered, issued);
    assert_eq!(minter.restore_in(y, &tampered), Restored::Foreign);
    assert_eq!(minter.restore_in(y, "1"), Restored::Not);
}

#[test]
fn restore_unwraps_exactly_one_level() {
    let minter = IdMinter::new();
    let inner = String::from_utf8(minter.mint("7")).unwrap();
    let outer = String::from_utf8(minter.mint(&inner)).unwrap();
    assert_eq!(restore(&outer).as_deref(), Some(inner.as_str()));
}

#[test]
fn restore_ignores_lookalikes() {
    for raw in [
        "1",
        r#""plain""#,
        r#""mcp-id-guard:""#,
        r#""mcp-id-guard:zz:1:1""#,
        r#""mcp-id-guard:0123456789abcdef::1""#,
        r#""mcp-id-guard:0123456789abcdef:1:""#,
        r#""mcp-id-guard:0123456789abcdef:1:1 ""#,
        r#""mcp-id-guard:0123456789abcdef:1:{""#,
        r#""\u006dcp-id-guard:0123456789abcdef:1:7""#,
    ] {
        assert_eq!(restore(raw), None, "{raw}");
    }
}
