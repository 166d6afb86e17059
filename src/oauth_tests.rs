use super::*;

#[test]
fn the_resource_metadata_is_where_the_challenge_says_else_at_the_well_known_address() {
    let header = r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp""#;
    assert_eq!(
        resource_metadata_url(Some(header), "https://mcp.example.com/mcp").as_deref(),
        Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp")
    );
    // Unquoted, other case, first parameter.
    assert_eq!(
        resource_metadata_url(
            Some("Bearer Resource_Metadata=https://a.example/m"),
            "https://x.example/mcp"
        )
        .as_deref(),
        Some("https://a.example/m")
    );
    // A parameter whose name only ends like it is not it.
    assert_eq!(
        resource_metadata_url(
            Some(r#"Bearer x_resource_metadata="https://evil.example/""#),
            "https://mcp.example.com/mcp/"
        )
        .as_deref(),
        Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp")
    );
    assert_eq!(
        resource_metadata_url(None, "http://127.0.0.1:9000").as_deref(),
        Some("http://127.0.0.1:9000/.well-known/oauth-protected-resource")
    );
    assert_eq!(resource_metadata_url(None, "ftp://x/mcp"), None);
    // A challenge naming an insecure or relative address is not followed.
    for named in [
        "http://evil.example/meta",
        "/meta",
        "chrome-extension://x/meta",
    ] {
        let header = format!("Bearer resource_metadata=\"{named}\"");
        assert_eq!(
            resource_metadata_url(Some(&header), "https://mcp.example.com/mcp").as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp"),
            "{named}"
        );
    }
}

#[test]
fn resource_metadata_must_be_for_this_server_and_name_a_secure_issuer() {
    let url = "https://mcp.example.com/mcp";
    let ok = ResourceMetadata::parse(
        &json!({ "resource": url, "authorization_servers": ["https://auth.example.com"], "scopes_supported": ["tools", "bad scope", ""] }),
        url,
    )
    .unwrap();
    assert_eq!(ok.issuer, "https://auth.example.com");
    assert_eq!(ok.scopes, ["tools"]);
    let other = ResourceMetadata::parse(
        &json!({ "resource": "https://other.example/mcp", "authorization_servers": ["https://auth.example.com"] }),
        url,
    );
    assert!(matches!(other, Err(OAuthError::Discovery(why)) if why.contains("other.example")));
    assert!(matches!(
        ResourceMetadata::parse(&json!({ "authorization_servers": [] }), url),
        Err(OAuthError::Discovery(_))
    ));
    assert_eq!(
        ResourceMetadata::parse(
            &json!({ "authorization_servers": ["http://auth.example.com"] }),
            url
        ),
        Err(OAuthError::Insecure("http://auth.example.com".into()))
    );
    assert!(is_secure_url("http://127.0.0.1:8080/token"));
    assert!(is_secure_url("http://localhost/token"));
    assert!(is_secure_url("http://[::1]:80/token"));
    assert!(!is_secure_url("http://127.0.0.1.evil.example/token"));
    assert!(!is_secure_url("http://user@evil.example/token"));
    assert!(!is_secure_url("javascript:alert(1)"));
    // The browser ends the host at a backslash: this one goes to
    // evil.example over http, whatever follows the @.
    assert!(!is_secure_url("http://evil.example\\@localhost/token"));
    assert!(!is_secure_url("https://auth.example.com/to ken"));
    assert!(!is_secure_url("https://auth.example.com/\u{7}"));
    assert!(
        !is_secure_url("http://mcp.example.com/mcp"),
        "a remote server over http gets no token"
    );
}

#[test]
fn the_authorization_server_must_be_the_issuer_asked_for_offer_s256_and_secure_endpoints() {
    assert_eq!(
        auth_server_metadata_urls("https://auth.example.com"),
        [
            "https://auth.example.com/.well-known/oauth-authorization-server",
            "https://auth.example.com/.well-known/openid-configuration"
        ]
    );
    assert_eq!(
        auth_server_metadata_urls("https://auth.example.com/tenant1/"),
        [
            "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
            "https://auth.example.com/.well-known/openid-configuration/tenant1",
            "https://auth.example.com/tenant1/.well-known/openid-configuration"
        ]
    );
    let issuer = "https://auth.example.com";
    let good = json!({
        "issuer": issuer,
        "authorization_endpoint": "https://auth.example.com/authorize",
        "token_endpoint": "https://auth.example.com/token",
        "registration_endpoint": "https://auth.example.com/register",
        "code_challenge_methods_supported": ["plain", "S256"],
    });
    let server = AuthServer::parse(&good, issuer).unwrap();
    assert_eq!(
        server.registration_endpoint.as_deref(),
        Some("https://auth.example.com/register")
    );
    let mut wrong = good.clone();
    wrong["issuer"] = json!("https://evil.example");
    assert!(matches!(
        AuthServer::parse(&wrong, issuer),
        Err(OAuthError::Discovery(_))
    ));
    let mut plain = good.clone();
    plain["code_challenge_methods_supported"] = json!(["plain"]);
    assert!(
        matches!(AuthServer::parse(&plain, issuer), Err(OAuthError::Discovery(why)) if why.contains("S256"))
    );
    let mut insecure = good.clone();
    insecure["token_endpoint"] = json!("http://auth.example.com/token");
    assert_eq!(
        AuthServer::parse(&insecure, issuer),
        Err(OAuthError::Insecure("http://auth.example.com/token".into()))
    );
    let mut missing = good;
    missing.as_object_mut().unwrap().remove("token_endpoint");
    assert!(
        matches!(AuthServer::parse(&missing, issuer), Err(OAuthError::Discovery(why)) if why.contains("token_endpoint"))
    );
}

#[test]
fn pkce_matches_rfc_7636_appendix_b_and_base64url_has_no_padding() {
    // RFC 7636 appendix B's verifier bytes and challenge.
    let random: [u8; 32] = [
        116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186, 22, 212, 37,
        77, 105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121,
    ];
    let (verifier, challenge) = pkce(&random);
    assert_eq!(verifier, "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk");
    assert_eq!(challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    assert_eq!(base64url(b""), "");
    assert_eq!(base64url(b"f"), "Zg");
    assert_eq!(base64url(b"fo"), "Zm8");
    assert_eq!(base64url(b"foo"), "Zm9v");
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

#[test]
fn the_authorization_address_carries_every_parameter_encoded_and_the_code_comes_back_only_with_its_state(
) {
    let scopes = vec!["tools".to_string(), "read".to_string()];
    let url = Authorization {
        endpoint: "https://auth.example.com/authorize?tenant=a b",
        client_id: "client 1",
        redirect_uri: "https://abc.chromiumapp.org/mcp",
        challenge: "E9Mel",
        state: "s&t",
        resource: "https://mcp.example.com/mcp",
        scopes: &scopes,
    }
    .url();
    assert_eq!(
        url,
        "https://auth.example.com/authorize?tenant=a b&response_type=code&client_id=client%201\
         &redirect_uri=https%3A%2F%2Fabc.chromiumapp.org%2Fmcp&code_challenge=E9Mel\
         &code_challenge_method=S256&state=s%26t&resource=https%3A%2F%2Fmcp.example.com%2Fmcp\
         &scope=tools%20read"
    );
    let back = "https://abc.chromiumapp.org/mcp?code=a%2Fb+c&state=s%26t#frag";
    assert_eq!(code_from_redirect(back, "s&t").unwrap(), "a/b c");
    assert_eq!(
        code_from_redirect("https://abc.chromiumapp.org/mcp?code=x&state=other", "s"),
        Err(OAuthError::StateMismatch)
    );
    assert_eq!(
        code_from_redirect("https://abc.chromiumapp.org/mcp?code=x", "s"),
        Err(OAuthError::StateMismatch)
    );
    assert_eq!(
        code_from_redirect(
            "https://abc.chromiumapp.org/mcp?error=access_denied&error_description=The%20user%20said%20no&state=s",
            "s"
        ),
        Err(OAuthError::Denied("access_denied: The user said no".into()))
    );
    assert!(matches!(
        code_from_redirect("https://abc.chromiumapp.org/mcp?state=s&code=", "s"),
        Err(OAuthError::Denied(_))
    ));
    // A stray % is kept as it is.
    assert_eq!(
        code_from_redirect("https://x/?code=100%&state=s", "s").unwrap(),
        "100%"
    );
}

#[test]
fn token_answers_become_grants_kept_per_server_and_renewed_with_their_refresh_token() {
    let url = "https://mcp.example.com/mcp";
    let token = "https://auth.example.com/token";
    let grant = Grant::from_tokens(
        &json!({ "access_token": "at1", "token_type": "bearer", "expires_in": 3600, "refresh_token": "rt1" }),
        1_000,
        url,
        token,
        "client-1",
        None,
    )
    .unwrap();
    assert_eq!(grant.expires_at, Some(3_601_000));
    assert!(!grant.expiring(1_000));
    assert!(grant.expiring(3_601_000 - EXPIRY_MARGIN_MS));
    assert_eq!(
        refresh_request(&grant).unwrap(),
        "grant_type=refresh_token&refresh_token=rt1&client_id=client-1&resource=https%3A%2F%2Fmcp.example.com%2Fmcp"
    );
    // A renewal without a new refresh token keeps the old one.
    let renewed = Grant::from_tokens(
        &json!({ "access_token": "at2", "token_type": "Bearer" }),
        2_000,
        url,
        token,
        "client-1",
        Some(&grant),
    )
    .unwrap();
    assert_eq!(renewed.refresh_token.as_deref(), Some("rt1"));
    assert_eq!(renewed.expires_at, None);
    // Kept and read back; a grant for another address is not this server's.
    assert_eq!(Grant::from_json(&grant.to_json(), url), Some(grant.clone()));
    assert_eq!(
        Grant::from_json(&grant.to_json(), "https://other.example/mcp"),
        None
    );
    assert_eq!(Grant::from_json(&json!({ "serverUrl": url }), url), None);
    assert_eq!(grant_key(url), "mcpGrant:https://mcp.example.com/mcp");
    // Refusals.
    assert!(matches!(
        Grant::from_tokens(&json!({ "access_token": "x", "token_type": "mac" }), 0, url, token, "c", None),
        Err(OAuthError::Token(why)) if why.contains("mac")
    ));
    assert!(matches!(
        Grant::from_tokens(&json!({ "token_type": "Bearer" }), 0, url, token, "c", None),
        Err(OAuthError::Token(_))
    ));
    assert_eq!(
        token_error(
            400,
            r#"{"error":"invalid_grant","error_description":"The code was used."}"#
        ),
        OAuthError::Token("HTTP 400, invalid_grant: The code was used.".into())
    );
    assert_eq!(
        token_error(502, "<html>"),
        OAuthError::Token("HTTP 502".into())
    );
    assert_eq!(
        code_request("c/1", "v", "client-1", "https://abc.chromiumapp.org/mcp", url),
        "grant_type=authorization_code&code=c%2F1&redirect_uri=https%3A%2F%2Fabc.chromiumapp.org%2Fmcp&client_id=client-1&code_verifier=v&resource=https%3A%2F%2Fmcp.example.com%2Fmcp"
    );
    let registration: Value =
        serde_json::from_str(&registration_body("https://abc.chromiumapp.org/mcp")).unwrap();
    assert_eq!(registration["token_endpoint_auth_method"], "none");
    assert_eq!(
        registration["redirect_uris"][0],
        "https://abc.chromiumapp.org/mcp"
    );
    assert_eq!(client_id(&json!({ "client_id": "c-9" })).unwrap(), "c-9");
    assert!(matches!(
        client_id(&json!({ "client_id": "" })),
        Err(OAuthError::Registration(_))
    ));
    let said = OAuthError::NoRegistration.describe("docs");
    assert!(
        said.starts_with("Signing in to the MCP server \"docs\" failed: "),
        "{said}"
    );
}
