// The terminal routes: a session's ptys over HTTP and WebSocket.
//
// Attached over a WebSocket, a terminal streams both ways: binary messages
// are its bytes (keystrokes in, output out), text messages are JSON
// controls. In: {"type":"resize","cols","rows"}, {"type":"input","data"}.
// Out: {"type":"exit", "exit_code"|"signal"|"error"} when it has ended,
// then a normal closure. Attaching starts with the scrollback (unless
// ?scrollback=0); closing the socket detaches and leaves it running.
#include <memory>
#include <string>

#include "daemon/api.h"
#include "session/terminal.h"

namespace agentbox::daemon {
namespace {

using nlohmann::json;

struct TerminalApi {
  Server& server;
  session::Manager& manager;

  void Blocking(const ReplyPtr& reply, std::function<void()> work) {
    if (!server.RunBlocking(std::move(work))) reply->Send(Busy());
  }

  void Open(Request req, ReplyPtr reply) {
    json body;
    Response error;
    if (!ParseObject(req, &body, &error)) return reply->Send(error);
    Blocking(reply, [this, reply, id = req.params[0], body = std::move(body)] {
      reply->Note("session", id);
      auto t = manager.OpenTerminal(id, body);
      if (!t.ok()) return reply->Send(ErrorFor(t.status()));
      Response r = Response::Json(201, *t);
      r.headers.emplace_back("Location", "/v1/sessions/" + id + "/ptys/" + (*t)["id"].get<std::string>());
      reply->Send(std::move(r));
    });
  }

  void List(Request req, ReplyPtr reply) {
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto list = manager.ListTerminals(id);
      if (!list.ok()) return reply->Send(ErrorFor(list.status()));
      reply->Send(Response::Json(200, {{"ptys", *list}}));
    });
  }

  void Get(Request req, ReplyPtr reply) {
    Blocking(reply, [this, reply, req = std::move(req)] {
      reply->Note("session", req.params[0]);
      auto t = manager.FindTerminal(req.params[0], req.params[1]);
      if (!t.ok()) return reply->Send(ErrorFor(t.status()));
      if (!req.websocket) return reply->Send(Response::Json(200, (*t)->Describe()));
      const bool replay = !(req.query.count("scrollback") && req.query.at("scrollback") == "0");
      reply->Upgrade(Attachment(*t, replay));
    });
  }

  // What an attached WebSocket does: the terminal's output goes out as it
  // comes, the socket's messages go in; its closing detaches.
  static WebSocketHandler Attachment(std::shared_ptr<session::Terminal> terminal, bool replay) {
    struct State {
      std::shared_ptr<session::Terminal> terminal;
      long token = 0;
    };
    auto state = std::make_shared<State>();
    state->terminal = std::move(terminal);
    WebSocketHandler h;
    h.on_open = [state, replay](std::shared_ptr<WebSocket> ws) {
      std::weak_ptr<WebSocket> weak = ws;
      state->token = state->terminal->Attach(
          [weak](std::string_view chunk) {
            if (auto w = weak.lock()) w->Send(std::string(chunk), true);
          },
          [weak](const json& end) {
            if (auto w = weak.lock()) {
              json message = end;
              message["type"] = "exit";
              w->Send(message.dump(), false);
              w->Close("the terminal has ended");
            }
          },
          [ws, replay](const std::string& scrollback) {
            if (replay && !scrollback.empty()) ws->Send(scrollback, true);
          });
    };
    h.on_message = [state](std::string data, bool binary) {
      if (binary) {
        state->terminal->Write(data);
        return;
      }
      json control = json::parse(data, nullptr, false);
      const std::string type = control.is_object() ? control.value("type", "") : "";
      if (type == "input" && control.contains("data") && control["data"].is_string()) {
        state->terminal->Write(control["data"].get<std::string>());
      } else if (type == "resize" && control.contains("cols") && control["cols"].is_number_integer() &&
                 control.contains("rows") && control["rows"].is_number_integer()) {
        (void)state->terminal->Resize(control["cols"].get<int>(), control["rows"].get<int>());
      }
      // Anything else is ignored: a control of a later version is no keystroke.
    };
    h.on_close = [state] {
      if (state->token) state->terminal->Detach(state->token);
    };
    return h;
  }

  void Resize(Request req, ReplyPtr reply) {
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"cols", "rows"}, {}, &error)) return reply->Send(error);
    if (!body.contains("cols") || !body["cols"].is_number_integer() || !body.contains("rows") ||
        !body["rows"].is_number_integer()) {
      return reply->Send(Response::Error(400, "bad_request", "fields 'cols' and 'rows' (integers) are required"));
    }
    Blocking(reply, [this, reply, req = std::move(req), body = std::move(body)] {
      auto t = manager.FindTerminal(req.params[0], req.params[1]);
      if (!t.ok()) return reply->Send(ErrorFor(t.status()));
      if (Status s = (*t)->Resize(body["cols"].get<int>(), body["rows"].get<int>()); !s.ok()) {
        return reply->Send(ErrorFor(s));
      }
      reply->Send(Response::Json(200, (*t)->Describe()));
    });
  }

  void Input(Request req, ReplyPtr reply) {
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"data"}, {"data"}, &error)) return reply->Send(error);
    if (!body.contains("data")) return reply->Send(Response::Error(400, "bad_request", "field 'data' is required"));
    Blocking(reply, [this, reply, req = std::move(req), body = std::move(body)] {
      auto t = manager.FindTerminal(req.params[0], req.params[1]);
      if (!t.ok()) return reply->Send(ErrorFor(t.status()));
      if (!(*t)->Write(body["data"].get<std::string>())) {
        return reply->Send(Response::Error(409, "conflict", "terminal " + req.params[1] +
                                                                " has ended or has too much input waiting"));
      }
      reply->Send(Response::NoContent());
    });
  }

  void Close(Request req, ReplyPtr reply) {
    Blocking(reply, [this, reply, req = std::move(req)] {
      reply->Note("session", req.params[0]);
      if (Status s = manager.CloseTerminal(req.params[0], req.params[1]); !s.ok()) return reply->Send(ErrorFor(s));
      reply->Send(Response::NoContent());
    });
  }
};

}  // namespace

void RegisterTerminalApi(Server& server, session::Manager& manager) {
  std::shared_ptr<TerminalApi> api(new TerminalApi{server, manager});
  auto bind = [api](void (TerminalApi::*method)(Request, ReplyPtr)) {
    return [api, method](Request req, ReplyPtr reply) { ((*api).*method)(std::move(req), std::move(reply)); };
  };
  Router& r = server.router();
  r.Add("POST", "/v1/sessions/{id}/ptys", bind(&TerminalApi::Open));
  r.Add("GET", "/v1/sessions/{id}/ptys", bind(&TerminalApi::List));
  r.Add("GET", "/v1/sessions/{id}/ptys/{pty}", bind(&TerminalApi::Get));
  r.Add("POST", "/v1/sessions/{id}/ptys/{pty}/resize", bind(&TerminalApi::Resize));
  r.Add("POST", "/v1/sessions/{id}/ptys/{pty}/input", bind(&TerminalApi::Input));
  r.Add("DELETE", "/v1/sessions/{id}/ptys/{pty}", bind(&TerminalApi::Close));
}

}  // namespace agentbox::daemon
