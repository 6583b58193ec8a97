//! Parsing `#[idempotent(...)]`'s arguments.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{bracketed, Ident, LitStr, Path, Token};

use crate::errors::Errors;
use crate::rules::{
    check_step_name, parse_millis, GRPC_CODES, GRPC_STORABLE_ON_REQUEST, NEVER_KEPT_HEADERS,
};

const EXPECTED: &str = "expected one of `scope`, `step`, `retain`, `lock_ttl`, `wait`, `timeout`, `fail_open`, `durable`, `group_commit`, `http`, `grpc`, `headers`, `metadata`, `key`, `fingerprint`, `store`, `never_store`";

/// What the step argument names.
pub(crate) enum StepArg {
    /// `step = "charge-card.v1"`.
    Literal(LitStr),
    /// `step = steps::CHARGE_CARD`, a constant declared with `steps!`.
    Path(Path),
}

/// A duration argument: its value and the literal, for spans.
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
}

/// The parsed arguments.
#[derive(Default)]
pub(crate) struct Args {
    /// The parameter names forming the scope, outermost first.
    pub(crate) scope: Option<Vec<LitStr>>,
    pub(crate) step: Option<StepArg>,
    pub(crate) retain: Option<DurationArg>,
    pub(crate) lock_ttl: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) timeout: Option<DurationArg>,
    pub(crate) fail_open: bool,
    pub(crate) durable: bool,
    /// `group_commit = false`: on SQLite, this step's claims commit alone.
    pub(crate) solo: bool,
    pub(crate) http: bool,
    /// `grpc`: a method of a tonic service impl.
    pub(crate) grpc: Option<Span>,
    /// Response headers (`http`) or metadata entries (`grpc`) kept beyond
    /// the default set (`headers = ["set-cookie"]`), lower-cased.
    pub(crate) headers: Option<(Span, Vec<String>)>,
    /// `key = request_id`: the request message's field that holds the key (AIP-155).
    pub(crate) key_field: Option<Ident>,
    /// `fingerprint = encoding`: the request message's protobuf encoding is
    /// its fingerprint, instead of its `Fingerprint` impl.
    pub(crate) fingerprint_encoding: Option<Span>,
    /// Statuses stored although the default does not (`store = [401]`,
    /// `store = [PERMISSION_DENIED]`).
    pub(crate) store: (Option<Span>, Vec<Status>),
    /// Statuses never stored for this handler (`never_store = [404]`).
    pub(crate) never_store: (Option<Span>, Vec<Status>),
}

/// A status named in `store` or `never_store`: an HTTP status, or a gRPC
/// code as `tonic::Code`'s variant.
pub(crate) enum Status {
    Http(u16),
    Grpc(Ident),
}

impl quote::ToTokens for Status {
    fn to_tokens(&self, tokens: &mut proc_macro2::TokenStream) {
        match self {
            Status::Http(status) => status.to_tokens(tokens),
            Status::Grpc(variant) => {
                quote::quote!(::idem::__private::grpc::tonic::Code::#variant).to_tokens(tokens)
            }
        }
    }
}

impl Args {
    /// Whether any argument changes the engine's default policy.
    pub(crate) fn overrides_policy(&self) -> bool {
        self.retain.is_some()
            || self.lock_ttl.is_some()
            || self.wait.is_some()
            || self.timeout.is_some()
            || self.fail_open
            || self.durable
            || self.solo
    }
}

/// Parses the arguments. Problems that do not stop the parse go to `errors`,
/// so they are reported together with the rest.
pub(crate) fn parse(input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<Args> {
    let mut args = Args::default();
    let mut raw_store: [(Option<Span>, Vec<StatusItem>); 2] =
        [(None, Vec::new()), (None, Vec::new())];
    let mut seen: Vec<String> = Vec::new();
    while !input.is_empty() {
        let name = Ident::parse_any(input)?;
        let key = name.to_string();
        if seen.contains(&key) {
            errors.push_at(
                name.span(),
                format!("`{key}` is given twice; give each argument once"),
            );
        }
        seen.push(key.clone());
        match key.as_str() {
            "scope" => {
                input.parse::<Token![=]>()?;
                args.scope = Some(parse_scope(input)?);
            }
            "step" => {
                input.parse::<Token![=]>()?;
                args.step = Some(parse_step(input, errors)?);
            }
            "retain" => args.retain = Some(parse_duration(input, errors)?),
            "lock_ttl" => args.lock_ttl = Some(parse_duration(input, errors)?),
            "wait" => args.wait = Some(parse_duration(input, errors)?),
            "timeout" => args.timeout = Some(parse_duration(input, errors)?),
            "fail_open" => args.fail_open = flag(input, &name)?,
            "durable" => args.durable = flag(input, &name)?,
            "group_commit" => {
                input.parse::<Token![=]>()?;
                let value: syn::LitBool = input.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`group_commit` takes `true` or `false`: `group_commit = false` commits this step's claims alone (SQLite)",
                    )
                })?;
                args.solo = !value.value;
            }
            "http" => args.http = flag(input, &name)?,
            "grpc" => {
                flag(input, &name)?;
                args.grpc = Some(name.span());
            }
            "store" => raw_store[0] = (Some(name.span()), parse_status_list(input, "store")?),
            "never_store" => {
                raw_store[1] = (Some(name.span()), parse_status_list(input, "never_store")?)
            }
            "headers" | "metadata" => {
                input.parse::<Token![=]>()?;
                args.headers = Some((name.span(), parse_headers(input, errors, &key)?));
            }
            "key" => {
                input.parse::<Token![=]>()?;
                args.key_field = Some(input.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`key` names the request message's field that holds the key, e.g. `key = request_id`",
                    )
                })?);
            }
            "fingerprint" => {
                input.parse::<Token![=]>()?;
                let value = Ident::parse_any(input)?;
                if value != "encoding" {
                    errors.push_at(
                        value.span(),
                        format!("`fingerprint` takes `encoding` (`fingerprint = encoding`: the request message's protobuf encoding is its fingerprint), not `{value}`"),
                    );
                }
                args.fingerprint_encoding = Some(name.span());
            }
            _ => {
                errors.push_at(name.span(), format!("unknown argument `{key}`; {EXPECTED}"));
                // Skip its value, if any, so the remaining arguments are still checked.
                if input.peek(Token![=]) {
                    input.parse::<Token![=]>()?;
                    input.parse::<syn::Expr>()?;
                }
            }
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    check_mode(&mut args, errors, raw_store);
    Ok(args)
}

fn parse_scope(input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
    if input.peek(syn::token::Bracket) {
        let content;
        let brackets = bracketed!(content in input);
        let names = content.parse_terminated(|p| p.parse::<LitStr>(), Token![,])?;
        if names.is_empty() {
            return Err(syn::Error::new(
                brackets.span.join(),
                "`scope` needs at least one parameter name, e.g. `scope = [\"tenant_id\", \"caller\"]`",
            ));
        }
        Ok(names.into_iter().collect())
    } else if input.peek(LitStr) {
        Ok(vec![input.parse()?])
    } else {
        Err(input.error("`scope` takes a parameter name as a string, e.g. `scope = \"tenant_id\"`, or several: `scope = [\"tenant_id\", \"caller\"]`"))
    }
}

fn parse_headers(
    input: ParseStream<'_>,
    errors: &mut Errors,
    arg: &str,
) -> syn::Result<Vec<String>> {
    if !input.peek(syn::token::Bracket) {
        return Err(input.error(format!(
            "`{arg}` takes names to keep besides the default set, e.g. `{arg} = [\"x-ledger-entry\"]`"
        )));
    }
    let content;
    bracketed!(content in input);
    let names = content.parse_terminated(|p| p.parse::<LitStr>(), Token![,])?;
    let mut kept = Vec::new();
    for literal in names {
        let name = literal.value().to_ascii_lowercase();
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            errors.push_at(
                literal.span(),
                format!("`{}` is not a header name", literal.value()),
            );
        } else if NEVER_KEPT_HEADERS.contains(&name.as_str()) {
            errors.push_at(
                literal.span(),
                format!("`{name}` is never stored: it describes one connection or is recomputed for each answer"),
            );
        } else {
            kept.push(name);
        }
    }
    Ok(kept)
}

/// One entry of `store = [...]` or `never_store = [...]` as written.
enum StatusItem {
    Number(syn::LitInt),
    Name(Ident),
}

fn parse_status_list(input: ParseStream<'_>, arg: &str) -> syn::Result<Vec<StatusItem>> {
    input.parse::<Token![=]>()?;
    if !input.peek(syn::token::Bracket) {
        return Err(input.error(format!(
            "`{arg}` takes a list: HTTP statuses in `http` mode (`{arg} = [401]`), \
             gRPC codes in `grpc` mode (`{arg} = [PERMISSION_DENIED]`)"
        )));
    }
    let content;
    bracketed!(content in input);
    let items = content.parse_terminated(
        |p| {
            if p.peek(syn::LitInt) {
                p.parse().map(StatusItem::Number)
            } else {
                p.parse().map(StatusItem::Name)
            }
        },
        Token![,],
    )?;
    Ok(items.into_iter().collect())
}

/// The HTTP status an entry names, if it is a valid one for `arg`.
fn http_status(item: &StatusItem, storing: bool, errors: &mut Errors) -> Option<u16> {
    let literal = match item {
        StatusItem::Number(literal) => literal,
        StatusItem::Name(name) => {
            errors.push_at(
                name.span(),
                format!(
                    "`{name}` is a gRPC code; an `http` handler names HTTP statuses, e.g. `404`"
                ),
            );
            return None;
        }
    };
    match literal.base10_parse::<u16>() {
        Ok(status) if storing && !(400..500).contains(&status) => errors.push_at(
            literal.span(),
            format!("`{status}` cannot be added to the stored statuses: only 4xx can (2xx and 3xx are stored, 5xx never)"),
        ),
        Ok(status) if !(100..600).contains(&status) => {
            errors.push_at(literal.span(), format!("`{status}` is not an HTTP status"))
        }
        Ok(status) => return Some(status),
        Err(_) => errors.push_at(literal.span(), format!("`{literal}` is not an HTTP status")),
    }
    None
}

/// `tonic::Code`'s variant for an entry, if it is a valid one for `arg`.
fn grpc_code(item: &StatusItem, storing: bool, errors: &mut Errors) -> Option<Ident> {
    let name = match item {
        StatusItem::Name(name) => name,
        StatusItem::Number(literal) => {
            errors.push_at(
                literal.span(),
                format!("`{literal}` is an HTTP status; a `grpc` method names gRPC codes, e.g. `NOT_FOUND`"),
            );
            return None;
        }
    };
    let written = name.to_string();
    let Some((_, variant)) = GRPC_CODES.iter().find(|(code, _)| *code == written) else {
        errors.push_at(
            name.span(),
            format!("`{written}` is not a gRPC status code; write it as the gRPC specification does, e.g. `NOT_FOUND`, `PERMISSION_DENIED`"),
        );
        return None;
    };
    if storing && !GRPC_STORABLE_ON_REQUEST.contains(&written.as_str()) {
        errors.push_at(
            name.span(),
            format!(
                "`{written}` cannot be added to the stored codes: only {} can (OK and the deterministic errors are stored already, transient codes never)",
                GRPC_STORABLE_ON_REQUEST.join(", ")
            ),
        );
        return None;
    }
    Some(Ident::new(variant, name.span()))
}

/// The checks that depend on the mode (`http`, `grpc` or neither), once
/// every argument is read: the statuses are turned into the mode's kind.
fn check_mode(args: &mut Args, errors: &mut Errors, raw: [(Option<Span>, Vec<StatusItem>); 2]) {
    if let (Some(grpc), true) = (args.grpc, args.http) {
        errors.push_at(
            grpc,
            "`http` and `grpc` are two modes; give one: `http` on an axum handler, `grpc` on a method of a tonic service impl",
        );
    }
    for (index, (span, items)) in raw.into_iter().enumerate() {
        let storing = index == 0;
        let Some(span) = span else { continue };
        let statuses = if args.http {
            items
                .iter()
                .filter_map(|item| http_status(item, storing, errors))
                .map(Status::Http)
                .collect()
        } else if args.grpc.is_some() {
            items
                .iter()
                .filter_map(|item| grpc_code(item, storing, errors))
                .map(Status::Grpc)
                .collect()
        } else {
            errors.push_at(
                span,
                "`store` and `never_store` choose the statuses `http` or `grpc` mode stores; add `http` or `grpc` (without either, the error type's `ErrorStatus::status` decides)",
            );
            Vec::new()
        };
        let slot = if storing {
            &mut args.store
        } else {
            &mut args.never_store
        };
        *slot = (Some(span), statuses);
    }
    if let (Some((span, _)), false) = (&args.headers, args.http || args.grpc.is_some()) {
        errors.push_at(
            *span,
            "`headers` (`metadata`) chooses the response headers `http` mode (metadata `grpc` mode) stores; add `http` or `grpc`, or remove it",
        );
    }
    if let (Some(span), None) = (args.fingerprint_encoding, args.grpc) {
        errors.push_at(
            span,
            "`fingerprint = encoding` fingerprints a gRPC request message's protobuf encoding; it needs `grpc` (elsewhere mark the fingerprinted parameter with `#[fingerprint]`)",
        );
    }
    if let (Some(field), None) = (&args.key_field, args.grpc) {
        errors.push_at(
            field.span(),
            "`key = <field>` takes the key from a gRPC request message's field; it needs `grpc` (an HTTP handler takes its key from the `Idempotency-Key` header)",
        );
    }
}

fn parse_step(input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<StepArg> {
    if input.peek(LitStr) {
        let literal: LitStr = input.parse()?;
        if let Err(why) = check_step_name(&literal.value()) {
            errors.push_at(
                literal.span(),
                format!("step name `{}` {why}", literal.value()),
            );
        }
        Ok(StepArg::Literal(literal))
    } else if input.peek(Ident)
        || input.peek(Token![::])
        || input.peek(Token![crate])
        || input.peek(Token![self])
        || input.peek(Token![super])
    {
        Ok(StepArg::Path(input.parse()?))
    } else {
        Err(input.error("`step` takes a step name, e.g. `step = \"charge-card.v1\"`, or a constant declared with `idem::steps!`"))
    }
}

fn parse_duration(input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<DurationArg> {
    input.parse::<Token![=]>()?;
    let literal: LitStr = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            "expected a duration such as \"24h\", \"30s\" or \"500ms\"",
        )
    })?;
    let millis = parse_millis(&literal.value()).unwrap_or_else(|| {
        errors.push_at(
            literal.span(),
            format!("`{}` is not a duration; write a number and a unit: `ms`, `s`, `m`, `h` or `d`, e.g. \"24h\"", literal.value()),
        );
        0
    });
    Ok(DurationArg { millis })
}

fn flag(input: ParseStream<'_>, name: &Ident) -> syn::Result<bool> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            name.span(),
            format!("`{name}` is a flag and takes no value; write just `{name}`"),
        ));
    }
    Ok(true)
}

/// The span to blame for a missing argument: the attribute itself.
pub(crate) fn missing(what: &str, example: &str) -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        format!("`#[idempotent]` needs `{what}`, e.g. `#[idempotent({example})]`"),
    )
}
