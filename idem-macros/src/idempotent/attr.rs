//! Parsing `#[idempotent(...)]`'s arguments.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{bracketed, Ident, LitStr, Path, Token};

use crate::errors::Errors;
use crate::rules::{check_step_name, parse_millis, NEVER_KEPT_HEADERS};

const EXPECTED: &str = "expected one of `scope`, `step`, `retain`, `lock_ttl`, `wait`, `timeout`, `fail_open`, `durable`, `http`, `headers`, `store`, `never_store`";

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
    pub(crate) http: bool,
    /// Response headers kept beyond the default set (`headers = ["set-cookie"]`),
    /// lower-cased.
    pub(crate) headers: Option<(Span, Vec<String>)>,
    /// 4xx statuses stored although the default does not (`store = [401]`).
    pub(crate) store: (Option<Span>, Vec<u16>),
    /// Statuses never stored for this handler (`never_store = [404]`).
    pub(crate) never_store: (Option<Span>, Vec<u16>),
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
    }
}

/// Parses the arguments. Problems that do not stop the parse go to `errors`,
/// so they are reported together with the rest.
pub(crate) fn parse(input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<Args> {
    let mut args = Args::default();
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
            "http" => args.http = flag(input, &name)?,
            "store" => args.store = (Some(name.span()), parse_statuses(input, errors, true)?),
            "never_store" => {
                args.never_store = (Some(name.span()), parse_statuses(input, errors, false)?)
            }
            "headers" => {
                input.parse::<Token![=]>()?;
                args.headers = Some((name.span(), parse_headers(input, errors)?));
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
    for span in [args.store.0, args.never_store.0].into_iter().flatten() {
        if !args.http {
            errors.push_at(
                span,
                "`store` and `never_store` choose the statuses `http` mode stores; add `http` (without it, the error type's `ErrorStatus::status` decides)",
            );
        }
    }
    if let (Some((span, _)), false) = (&args.headers, args.http) {
        errors.push_at(
            *span,
            "`headers` chooses the response headers `http` mode stores; add `http`, or remove `headers`",
        );
    }
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

fn parse_headers(input: ParseStream<'_>, errors: &mut Errors) -> syn::Result<Vec<String>> {
    const FORM: &str = "`headers` takes header names to keep besides the default set, e.g. `headers = [\"set-cookie\"]`";
    if !input.peek(syn::token::Bracket) {
        return Err(input.error(FORM));
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

fn parse_statuses(
    input: ParseStream<'_>,
    errors: &mut Errors,
    storing: bool,
) -> syn::Result<Vec<u16>> {
    let form = if storing {
        "`store` takes 4xx statuses to store besides the default set, e.g. `store = [401]`"
    } else {
        "`never_store` takes statuses this handler never stores, e.g. `never_store = [404]`"
    };
    input.parse::<Token![=]>()?;
    if !input.peek(syn::token::Bracket) {
        return Err(input.error(form));
    }
    let content;
    bracketed!(content in input);
    let literals = content.parse_terminated(|p| p.parse::<syn::LitInt>(), Token![,])?;
    let mut statuses = Vec::new();
    for literal in literals {
        match literal.base10_parse::<u16>() {
            Ok(status) if storing && !(400..500).contains(&status) => errors.push_at(
                literal.span(),
                format!("`{status}` cannot be added to the stored statuses: only 4xx can (2xx and 3xx are stored, 5xx never)"),
            ),
            Ok(status) if !(100..600).contains(&status) => {
                errors.push_at(literal.span(), format!("`{status}` is not an HTTP status"))
            }
            Ok(status) => statuses.push(status),
            Err(_) => errors.push_at(literal.span(), format!("`{literal}` is not an HTTP status")),
        }
    }
    Ok(statuses)
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
