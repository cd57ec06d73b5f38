//! The header edits as they were written first: the model the single-pass
//! versions must match exactly.

use std::net::IpAddr;

use http::header::{HeaderName, HeaderValue, CONNECTION, EXPECT, FORWARDED, HOST};
use http::uri::Authority;
use http::HeaderMap;

use super::{HOP_BY_HOP, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};

pub(super) fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

pub(super) fn prepare_request(
    headers: &mut HeaderMap,
    upstream_host: &HeaderValue,
    authority: Option<&Authority>,
    client_ip: Option<IpAddr>,
    preserve_host: bool,
    trust_forwarded: bool,
) {
    let client_host = headers
        .get(HOST)
        .cloned()
        .or_else(|| authority.and_then(|authority| HeaderValue::from_str(authority.as_str()).ok()));
    remove_hop_by_hop(headers);
    headers.remove(EXPECT);
    let host = match (&client_host, preserve_host) {
        (Some(client_host), true) => client_host.clone(),
        _ => upstream_host.clone(),
    };
    headers.insert(HOST, host);
    if !trust_forwarded {
        headers.remove(FORWARDED);
        match client_ip {
            Some(ip) => {
                headers.insert(&X_FORWARDED_FOR, ip.to_string().parse().unwrap());
            }
            None => {
                headers.remove(&X_FORWARDED_FOR);
            }
        }
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        match client_host {
            Some(client_host) => {
                headers.insert(&X_FORWARDED_HOST, client_host);
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
        return;
    }
    if let Some(ip) = client_ip {
        let mut list: Vec<u8> = Vec::new();
        for value in headers.get_all(&X_FORWARDED_FOR) {
            if !list.is_empty() {
                list.extend_from_slice(b", ");
            }
            list.extend_from_slice(value.as_bytes());
        }
        if !list.is_empty() {
            list.extend_from_slice(b", ");
        }
        list.extend_from_slice(ip.to_string().as_bytes());
        if let Ok(value) = HeaderValue::from_bytes(&list) {
            headers.insert(&X_FORWARDED_FOR, value);
        }
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(client_host) = client_host {
        if !headers.contains_key(&X_FORWARDED_HOST) {
            headers.insert(&X_FORWARDED_HOST, client_host);
        }
    }
}
