// A reply's details under its text: template and why, time to first token, speed, token counts.
// The app sends the items already in the user's language (backend/chat/render.py details_line); the look is in
// public/ernie.css (Chainlit's stylesheet has only the utility classes its own build uses).
export default function ReplyDetails() {
  return (
    <div className="reply-details" title={props.title} aria-label={props.label}>
      {props.items.map((item, i) => (
        <span key={i} className="reply-detail">
          {i > 0 ? "· " : ""}
          {item}
        </span>
      ))}
    </div>
  );
}
