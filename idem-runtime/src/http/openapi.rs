//! OpenAPI documentation of idempotent operations, through
//! [utoipa](https://docs.rs/utoipa) (feature `openapi`).
//!
//! [`document`] adds to an operation what idem adds to it at run time: the
//! `Idempotency-Key` request header, the `Idempotent-Replayed` response
//! header on its own responses, and the problem responses idem answers with
//! (400 key missing or malformed, 409 in progress, 422 key reused, 503 store
//! unavailable or busy), each an `application/problem+json` [`Problem`](crate::Problem).
//!
//! ```
//! use idem_runtime::http::openapi::{self, utoipa};
//! use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathsBuilder};
//! use utoipa::openapi::{OpenApiBuilder, ResponseBuilder};
//!
//! let create = OperationBuilder::new()
//!     .operation_id(Some("createOrder"))
//!     .response("201", ResponseBuilder::new().description("Order created"))
//!     .build();
//! let mut api = OpenApiBuilder::new()
//!     .paths(PathsBuilder::new().path("/orders", PathItem::new(HttpMethod::Post, create)))
//!     .build();
//! assert!(openapi::document(&mut api, "/orders", HttpMethod::Post));
//!
//! let json = serde_json::to_value(&api).unwrap();
//! let post = &json["paths"]["/orders"]["post"];
//! assert_eq!(post["parameters"][0]["name"], "Idempotency-Key");
//! assert!(post["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
//! assert!(post["responses"]["422"]["content"]["application/problem+json"].is_object());
//! assert!(json["components"]["schemas"]["Problem"].is_object());
//! ```

pub use utoipa;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{HttpMethod, Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{
    Components, ContentBuilder, OpenApi, Ref, RefOr, Required, ResponseBuilder, Schema,
};

use super::problem::{types, PROBLEM_JSON};
use super::IDEMPOTENT_REPLAYED;

/// The name of the problem schema in `components.schemas`.
pub const PROBLEM_SCHEMA: &str = "Problem";

/// Documents the operation at `path` and `method` of `openapi` as idempotent
/// ([`document_operation`]) and adds the [`Problem`](crate::Problem) schema
/// ([`add_problem_schema`]); `false` when `openapi` has no such operation.
pub fn document(openapi: &mut OpenApi, path: &str, method: HttpMethod) -> bool {
    let Some(item) = openapi.paths.paths.get_mut(path) else {
        return false;
    };
    let operation = match method {
        HttpMethod::Get => &mut item.get,
        HttpMethod::Post => &mut item.post,
        HttpMethod::Put => &mut item.put,
        HttpMethod::Delete => &mut item.delete,
        HttpMethod::Options => &mut item.options,
        HttpMethod::Head => &mut item.head,
        HttpMethod::Patch => &mut item.patch,
        HttpMethod::Trace => &mut item.trace,
    };
    let Some(operation) = operation.as_mut() else {
        return false;
    };
    document_operation(operation);
    add_problem_schema(openapi);
    true
}

/// Adds the `Idempotency-Key` header parameter, `Idempotent-Replayed` on
/// every response the operation already documents, and idem's 400, 409, 422
/// and 503 problem responses (leaving any the operation documents itself).
/// The problems refer to the schema [`add_problem_schema`] adds.
pub fn document_operation(operation: &mut Operation) {
    let key = ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::True)
        .description(Some(
            "A unique value per operation (a UUID), sent again with every retry of it: 1 to 255 visible \
             ASCII characters, as a structured-field string (\"...\") or bare. A retry with the same key \
             and request gets the first answer back, marked Idempotent-Replayed: true.",
        ))
        .schema(Some(string_schema(Some(1), Some(257))))
        .build();
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    if !parameters
        .iter()
        .any(|p| p.name.eq_ignore_ascii_case("idempotency-key"))
    {
        parameters.push(key);
    }

    for response in operation.responses.responses.values_mut() {
        if let RefOr::T(response) = response {
            response.headers.insert(
                "Idempotent-Replayed".to_owned(),
                HeaderBuilder::new()
                    .schema(string_schema(None, None))
                    .description(Some(
                        "\"true\" when this answer is the stored answer to an earlier request with the same key.",
                    ))
                    .build(),
            );
        }
    }
    debug_assert!(IDEMPOTENT_REPLAYED.eq_ignore_ascii_case("idempotent-replayed"));

    let problems: [(&str, &str, &[&str], bool); 4] = [
        (
            "400",
            "The Idempotency-Key header is missing or malformed, or the body is.",
            &[types::KEY_MISSING, types::KEY_MALFORMED, types::MALFORMED_BODY],
            false,
        ),
        (
            "409",
            "Another attempt with this key is still running; retry after Retry-After seconds.",
            &[types::IN_PROGRESS],
            true,
        ),
        (
            "422",
            "This key was used before with a different request; nothing was executed.",
            &[types::KEY_REUSED],
            false,
        ),
        (
            "503",
            "The idempotency store is unavailable or busy; nothing was executed. Retry after Retry-After seconds.",
            &[types::STORE_UNAVAILABLE, types::STORE_BUSY],
            true,
        ),
    ];
    for (status, description, kinds, retry_after) in problems {
        if operation.responses.responses.contains_key(status) {
            continue;
        }
        let description = format!("{description} Problem types: {}.", kinds.join(", "));
        let mut response = ResponseBuilder::new().description(description).content(
            PROBLEM_JSON,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(PROBLEM_SCHEMA)))
                .build(),
        );
        if retry_after {
            response = response.header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(
                        ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(1)),
                    )
                    .description(Some("Seconds to wait before retrying with the same key."))
                    .build(),
            );
        }
        operation
            .responses
            .responses
            .insert(status.to_owned(), RefOr::T(response.build()));
    }
}

/// Adds the [`Problem`](crate::Problem) schema (RFC 9457) to `openapi`'s components, under
/// [`PROBLEM_SCHEMA`].
pub fn add_problem_schema(openapi: &mut OpenApi) {
    openapi
        .components
        .get_or_insert_with(Components::new)
        .schemas
        .insert(PROBLEM_SCHEMA.to_owned(), problem_schema());
}

/// The schema of a [`Problem`](crate::Problem) body.
fn problem_schema() -> RefOr<Schema> {
    let text = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
    };
    ObjectBuilder::new()
        .description(Some("RFC 9457 problem details."))
        .property(
            "type",
            text("A URI naming the kind of problem; idem's are sections of its PROBLEMS.md."),
        )
        .property("title", text("A short summary of the kind of problem."))
        .property(
            "status",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .description(Some("The HTTP status.")),
        )
        .property(
            "detail",
            text("What happened this time, and what the client can do about it."),
        )
        .required("type")
        .required("title")
        .required("status")
        .into()
}

fn string_schema(min: Option<usize>, max: Option<usize>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(min)
        .max_length(max)
}
